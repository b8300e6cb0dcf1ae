#pragma once

// llamacpp-instr: the session's log file, NDJSON lines buffered in memory and written in blocks.
// Not thread-safe: the session calls it with its lock held.
//
// Always on: the file can be rotated (LOG -> LOG.1 -> ... -> LOG.keep, a new LOG) once it holds
// max_bytes, or reopened at its path (SIGHUP, for logrotate); the session writes a session_start
// at the head of each new file. A rotation that cannot finish moves no file. A failed write (a
// full disk) suspends writing with one warning line on stderr, leaves the file ending on a
// complete line, and drops records (counted as lost) until the next rotation or reopen succeeds.

#include <cstdint>
#include <cstdio>
#include <string>

#if !defined(_WIN32)
#    include <sys/types.h>
#endif

namespace llama_instr {

struct log_file {
    FILE *      fp = nullptr;            // set while a session is open (written through its descriptor)
    std::string path;
    std::string buf;                     // complete lines not yet written
    int64_t     buf_records = 0;
    int64_t     buf_since   = 0;         // when the oldest buffered line was added

    int32_t      status = 0;             // LLAMA_INSTR_OK, or the first failure: ERR_IO or ERR_INTERNAL
    std::string  failure;                // why, or empty with failed_hook set
    const char * failed_hook = nullptr;  // the hook whose failure is `status` (set without allocating)

    int64_t n_records = 0;               // lines written or buffered
    int64_t n_lost    = 0;               // records lost to a write error or an internal failure

    // the current file
    int64_t file_bytes        = 0;      // its size: whole lines only
    int64_t dropped_bytes     = 0;      // bytes of the records dropped while writing was suspended
    bool    suspended         = false;  // a write failed: records are dropped until a reopen succeeds
    int64_t n_lost_at_suspend = 0;      // n_lost when writing was suspended (for the resume notice)
    bool    quiet             = false;  // no warning when a write fails (the caller reports it)
    bool    resuming          = false;  // reopened after a failed write: said by the first write that succeeds
    bool    warned            = false;  // the failure was said, its resume not yet
    int64_t t_warned          = 0;      // when a failure was last said
    bool    reopen_warned     = false;  // a reopen or rotation failed and was said; quiet until one succeeds

    // rotation (0: never)
    int64_t max_bytes = 0;
    int32_t keep      = 0;

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

    // a failed write is said at most this often (a disk that stays full)
    static constexpr int64_t WARN_EVERY_NS = 60LL * 1000 * 1000 * 1000;

    // Append one complete record (no newline); written at once when the buffer is full or its
    // oldest line is old enough.
    void emit(const std::string & line);

    // Write the buffered lines now. A failed write suspends writing (see above).
    void write_buffered();

    // Has the current file reached max_bytes (counting what is buffered and what was dropped)?
    bool full() const { return max_bytes > 0 && file_bytes + dropped_bytes + (int64_t) buf.size() >= max_bytes; }

    // Write what is buffered and start a new file at `path`. With `rotate`, the series shifts
    // (path.keep is removed, path.N becomes path.N+1, the current file path.1) and the new file,
    // opened under a temporary name first, takes path's place; a rotation that cannot finish
    // leaves every file where it was, however often it is tried (see rotate_series in the .cpp).
    // A current file no longer at the path (removed, or moved without SIGHUP) is not rotated: no
    // kept file moves, the path is opened anew, and a removed or replaced one fails the session
    // (its records are lost, as at session end). The buffer is empty after it; the caller writes
    // the new file's head. False if the new file could not be opened or put in place: writing goes
    // on into the current file, one warning says why (none for the failures that follow it until
    // a new file is started), and the caller tries again later. Whatever fails or throws
    // (std::bad_alloc) leaves exactly one file open: the current one, or the new one in its place.
    bool reopen(bool rotate);

    // Is the file at `path` still the one open? nullptr, or why not (removing or replacing it loses
    // what is written).
    const char * gone() const;

    // Close the file (the buffer is dropped: write it first). False if closing failed.
    bool close();

  private:
    bool open_at(const std::string & p);  // open p into fp and the identity fields
    // reopen's two ways to a new file, each false (and why) where it fails: the path opened anew,
    // or the series rotated with the new file opened under LOG.new first. `opened`: the new file,
    // once open.
    bool open_anew(const std::string & at, FILE *& opened, std::string & why);
    bool rotate_files(const std::string & at, FILE *& opened, std::string & why);
    void suspend(int err);  // a write failed with errno err
    void resumed();         // a write succeeded: say so if writing resumed
};

}  // namespace llama_instr
