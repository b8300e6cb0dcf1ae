#include "llama-instr-log.h"

#include "llama-instr-session.h"

#include <cerrno>
#include <cstring>

#if !defined(_WIN32)
#    include <fcntl.h>
#    include <limits.h>
#    include <sys/stat.h>
#    include <unistd.h>
#endif

namespace llama_instr {

#if !defined(_WIN32)
// The file opened at `p` (O_NOFOLLOW: a symbolic link planted at the log's name is refused, as
// logs hold prompts; 0600 for the same reason), its identity, and whether it ends mid-line.
static FILE * open_log(const std::string & p, struct stat & fst, bool & partial_line) {
    // read-write: the last byte is read through the same descriptor
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return nullptr;
    }
    char c       = '\n';
    partial_line = false;
    if (fstat(fd, &fst) != 0) {
        const int err = errno;
        ::close(fd);
        errno = err;
        return nullptr;
    }
    if (fst.st_size > 0 && pread(fd, &c, 1, fst.st_size - 1) == 1) {
        partial_line = c != '\n';
    }
    FILE * f = fdopen(fd, "ab");
    if (!f) {
        const int err = errno;
        ::close(fd);
        errno = err;
    }
    return f;
}
#endif

bool log_file::open(const std::string & p) {
    bool partial_line = false;
#if !defined(_WIN32)
    struct stat fst;
    FILE *      f = open_log(p, fst, partial_line);
#else
    FILE * f = fopen(p.c_str(), "ab");
#endif
    if (!f) {
        return false;
    }
    fp   = f;
    path = p;
    buf.clear();
    buf_records = 0;
    status      = LLAMA_INSTR_OK;
    failure.clear();
    failed_hook = nullptr;
    n_records   = 0;
    n_lost      = 0;
#if !defined(_WIN32)
    dev      = fst.st_dev;
    ino      = fst.st_ino;
    abs_path = p;
    char cwd[PATH_MAX];
    if (p[0] != '/' && getcwd(cwd, sizeof(cwd))) {
        abs_path = std::string(cwd) + "/" + p;
    }
#endif
    if (partial_line) {
        // the last session's end was lost (a full disk): its partial line stays on its own
        buf.push_back('\n');
    }
    return true;
}

void log_file::hook_failed(const char * hook) noexcept {
    if (status == LLAMA_INSTR_OK) {
        status      = LLAMA_INSTR_ERR_INTERNAL;
        failed_hook = hook;
    }
    n_lost++;
}

std::string log_file::failure_message() const {
    if (failure.empty() && failed_hook) {
        return std::string(failed_hook) + " failed (out of memory?): records were lost";
    }
    return failure;
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
    if (buf.size() >= FLUSH_BYTES || due(now)) {
        write_buffered();
    }
}

const char * log_file::gone() const {
#if !defined(_WIN32)
    // the open file itself says whether it was removed; its path, made absolute when it was
    // opened, whether another file took its place
    struct stat open_st, path_st;
    if (fstat(fileno(fp), &open_st) == 0 && open_st.st_nlink == 0) {
        return "was removed while the session was open";
    }
    if (stat(abs_path.c_str(), &path_st) == 0 && (path_st.st_dev != dev || path_st.st_ino != ino)) {
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
