#include "llama-instr-log.h"

#include "llama-instr-session.h"

#include <cerrno>
#include <cstring>

#if !defined(_WIN32)
#    include <sys/stat.h>
#    include <unistd.h>
#endif

namespace llama_instr {

// Lines are written in blocks of 64 KiB, or when the oldest buffered line is 200 ms old, so that a
// reader following the log (instr follow) is never further behind than that.
constexpr size_t  FLUSH_BYTES = 64 * 1024;
constexpr int64_t FLUSH_NS    = 200 * 1000 * 1000;

bool log_file::open(const std::string & p) {
    FILE * f = fopen(p.c_str(), "ab");
    if (!f) {
        return false;
    }
    fp   = f;
    path = p;
    buf.clear();
    buf_records = 0;
    status      = LLAMA_INSTR_OK;
    failure.clear();
    n_records = 0;
    n_lost    = 0;
#if !defined(_WIN32)
    struct stat fst;
    if (fstat(fileno(fp), &fst) == 0) {
        dev = fst.st_dev;
        ino = fst.st_ino;
    }
#endif
    return true;
}

void log_file::fail(int32_t code, const std::string & why) {
    if (status == LLAMA_INSTR_OK) {
        status  = code;
        failure = why;
    }
}

void log_file::write_buffered() {
    if (!fp || buf.empty()) {
        buf.clear();
        buf_records = 0;
        return;
    }
    if (status != LLAMA_INSTR_ERR_IO) {
        const size_t n  = fwrite(buf.data(), 1, buf.size(), fp);
        const int    rc = n == buf.size() ? fflush(fp) : EOF;
        if (rc != 0) {
            const int err = errno;
            fail(LLAMA_INSTR_ERR_IO, "writing the log " + path + " failed: " + strerror(err));
            status = LLAMA_INSTR_ERR_IO;  // stop writing, even after an internal failure
        }
    }
    if (status == LLAMA_INSTR_ERR_IO) {
        n_lost += buf_records;
    }
    buf.clear();
    buf_records = 0;
}

void log_file::emit(const std::string & line) {
    n_records++;
    if (status == LLAMA_INSTR_ERR_IO) {
        n_lost++;
        return;
    }
    const int64_t now = now_ns();
    if (buf.empty()) {
        buf_since = now;
    }
    buf += line;
    buf.push_back('\n');
    buf_records++;
    if (buf.size() >= FLUSH_BYTES || now - buf_since >= FLUSH_NS) {
        write_buffered();
    }
}

const char * log_file::gone() const {
#if !defined(_WIN32)
    struct stat now_st;
    if (stat(path.c_str(), &now_st) != 0) {
        return "was removed while the session was open";
    }
    if (now_st.st_dev != dev || now_st.st_ino != ino) {
        return "was replaced while the session was open";
    }
#endif
    return nullptr;
}

bool log_file::close() {
    const bool ok = fclose(fp) == 0;
    fp            = nullptr;
    buf.clear();
    buf_records = 0;
    return ok;
}

}  // namespace llama_instr
