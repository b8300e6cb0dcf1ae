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
    std::string buf;              // complete lines not yet written
    int64_t     buf_records = 0;
    int64_t     buf_since   = 0;  // when the oldest buffered line was added

    int32_t     status = 0;       // LLAMA_INSTR_OK, or the first failure: ERR_IO or ERR_INTERNAL
    std::string failure;

    int64_t n_records = 0;  // lines written or buffered
    int64_t n_lost    = 0;  // records lost to a write error or an internal failure

#if !defined(_WIN32)
    dev_t dev = 0;  // the file opened, to notice it being removed or replaced
    ino_t ino = 0;
#endif

    // Create or append to `p`. False (and errno set) if it cannot be opened.
    bool open(const std::string & p);

    // The first failure wins; records from here on are lost.
    void fail(int32_t code, const std::string & why);

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
