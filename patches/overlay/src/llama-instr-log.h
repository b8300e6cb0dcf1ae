#pragma once

// llamacpp-instr: the session's log file, NDJSON lines buffered in memory and written in blocks.
// Not thread-safe: the session calls it with its lock held.

#include <cstdint>
#include <cstdio>
#include <string>

#if !defined(_WIN32)
#    include <sys/types.h>
#endif

namespace llama_instr {

struct log_file {
    FILE *      fp = nullptr;
    std::string path;
    std::string buf;                     // complete lines not yet written
    int64_t     buf_records = 0;
    int64_t     buf_since   = 0;         // when the oldest buffered line was added

    int32_t      status = 0;             // LLAMA_INSTR_OK, or the first failure: ERR_IO or ERR_INTERNAL
    std::string  failure;                // why, or empty with failed_hook set
    const char * failed_hook = nullptr;  // the hook whose failure is `status` (set without allocating)

    int64_t n_records = 0;               // lines written or buffered
    int64_t n_lost    = 0;               // records lost to a write error or an internal failure

#if !defined(_WIN32)
    std::string abs_path;  // `path` made absolute when opened: a later chdir does not move it
    dev_t       dev = 0;   // the file opened, to notice it being removed or replaced
    ino_t       ino = 0;
#endif

    // Create (mode 0600, not through a symbolic link at the last path component) or append to
    // `p`; after a partial last line (a full disk) the first record starts on a fresh line. False
    // (and errno set) if it cannot be opened.
    bool open(const std::string & p);

    // The first failure wins; records from here on are lost.
    void fail(int32_t code, const std::string & why);

    // A hook failed (out of memory): like fail(ERR_INTERNAL, ...) and one record lost, without
    // allocating. `hook` is a string literal.
    void hook_failed(const char * hook) noexcept;

    // What failed, for llama_instr_last_error.
    std::string failure_message() const;

    // Is the oldest buffered line old enough to be written now?
    bool due(int64_t now) const { return !buf.empty() && now - buf_since >= FLUSH_NS; }

    // Lines are written in blocks of 64 KiB, or when the oldest buffered line is 200 ms old (on
    // the next record, or by the session's flusher thread), so that a reader following the log
    // (instr follow) is never further behind than that.
    static constexpr size_t  FLUSH_BYTES = 64 * 1024;
    static constexpr int64_t FLUSH_NS    = 200 * 1000 * 1000;

    // Append one complete record (no newline); written at once when the buffer is full or its
    // oldest line is old enough.
    void emit(const std::string & line);

    // Write the buffered lines now.
    void write_buffered();

    // Is the file at `path` still the one open? nullptr, or why not (removing or replacing it loses
    // what is written).
    const char * gone() const;

    // Close the file (the buffer is dropped: write it first). False if closing failed.
    bool close();
};

}  // namespace llama_instr
