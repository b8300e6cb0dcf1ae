#include "llama-instr-log.h"

#include "llama-instr-session.h"

#include <cerrno>
#include <cstring>
#include <vector>

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

// one line on stderr, as the LLAMA_INSTR_LOG session's other warnings
static void warn(const std::string & msg) {
    fprintf(stderr, "llama-instr: %s\n", msg.c_str());
    fflush(stderr);
}

bool log_file::open_at(const std::string & p) {
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
    fp = f;
    buf.clear();
    buf_records   = 0;
    dropped_bytes = 0;
#if !defined(_WIN32)
    dev        = fst.st_dev;
    ino        = fst.st_ino;
    file_bytes = (int64_t) fst.st_size;
#else
    file_bytes = 0;
#endif
    if (partial_line) {
        // the last session's end was lost (a full disk): its partial line stays on its own
        buf.push_back('\n');
    }
    return true;
}

bool log_file::open(const std::string & p) {
    if (!open_at(p)) {
        return false;
    }
    path   = p;
    status = LLAMA_INSTR_OK;
    failure.clear();
    failed_hook       = nullptr;
    n_records         = 0;
    n_lost            = 0;
    suspended         = false;
    resuming          = false;
    warned            = false;
    t_warned          = 0;
    reopen_warned     = false;
    n_lost_at_suspend = 0;
#if !defined(_WIN32)
    abs_path = p;
    char cwd[PATH_MAX];
    if (p[0] != '/' && getcwd(cwd, sizeof(cwd))) {
        abs_path = std::string(cwd) + "/" + p;
    }
#endif
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
    if (status == LLAMA_INSTR_ERR_IO && n_lost > 0) {
        return failure + " (" + std::to_string(n_lost) + " records lost)";
    }
    return failure;
}

void log_file::fail(int32_t code, const std::string & why) {
    if (status == LLAMA_INSTR_OK) {
        status  = code;
        failure = why;
    }
}

void log_file::suspend(int err) {
    const std::string why = "writing the log " + path + " failed: " + strerror(err);
    fail(LLAMA_INSTR_ERR_IO, why);
    status            = LLAMA_INSTR_ERR_IO;  // reported at the end, even after an internal failure
    suspended         = true;
    resuming          = false;
    // one line when writing stops; a disk that stays full while rotations free a little of it
    // again and again says so at most once a minute
    const int64_t now = now_ns();
    if (quiet || warned || (t_warned != 0 && now - t_warned < WARN_EVERY_NS)) {
        return;
    }
    warned            = true;
    t_warned          = now;
    n_lost_at_suspend = n_lost;
    warn(why + ": records are dropped until the log is reopened" + (max_bytes > 0 ? " or rotated" : ""));
}

void log_file::resumed() {
    if (resuming) {
        resuming = false;
        if (warned) {
            warned = false;
            warn("writing the log " + path + " again (" + std::to_string(n_lost - n_lost_at_suspend) +
                 " records were lost)");
        }
    }
}

void log_file::write_buffered() {
    if (!fp || buf.empty()) {
        buf.clear();
        buf_records = 0;
        return;
    }
    if (!suspended) {
#if !defined(_WIN32)
        // straight to the descriptor (stdio's buffer is never used): a failed write is undone to
        // the last whole line, so the file never ends mid-record
        const int fd   = fileno(fp);
        size_t    done = 0;
        int       err  = 0;
        while (done < buf.size()) {
            const ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                err = n < 0 ? errno : EIO;
                break;
            }
            done += (size_t) n;
        }
        if (err != 0) {
            if (done > 0 && ftruncate(fd, (off_t) file_bytes) != 0) {
                // the partial line stays: a reader skips it as damaged
            }
            suspend(err);
        } else {
            file_bytes += (int64_t) buf.size();
            resumed();
        }
#else
        const size_t n  = fwrite(buf.data(), 1, buf.size(), fp);
        const int    rc = n == buf.size() ? fflush(fp) : EOF;
        if (rc != 0) {
            suspend(errno);
        } else {
            file_bytes += (int64_t) buf.size();
            resumed();
        }
#endif
    }
    if (suspended) {
        n_lost += buf_records;
        dropped_bytes += (int64_t) buf.size();
    }
    buf.clear();
    buf_records = 0;
}

void log_file::emit(const std::string & line) {
    n_records++;
    if (suspended) {
        n_lost++;
        dropped_bytes += (int64_t) line.size() + 1;
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

#if !defined(_WIN32)
namespace {

// The names of a rotated series and those a rotation uses on the way: name[0] is the log, name[k]
// LOG.k (k = 1..keep); prev[k], LOG.k.old, a second name of LOG.k's file while the series shifts;
// next[k], LOG.k.new, a second name of the file that becomes LOG.k (next[0], LOG.new, is the new
// file itself). None ends in a number: no reader takes one for a file of the series.
struct series_names {
    std::vector<std::string> name, prev, next;

    series_names(const std::string & at, int32_t keep) :
        name((size_t) keep + 1),
        prev((size_t) keep + 1),
        next((size_t) keep + 1) {
        name[0] = at;
        next[0] = at + ".new";
        for (size_t k = 1; k < name.size(); k++) {
            name[k] = at + "." + std::to_string(k);
            prev[k] = name[k] + ".old";
            next[k] = name[k] + ".new";
        }
    }

    size_t keep() const { return name.size() - 1; }
};

// The first step of a rotation that failed: the name it was to make or remove, and its errno.
struct step_failed {
    const std::string * name = nullptr;
    int                 err  = 0;

    void operator()(const std::string & p) {
        if (!name) {
            name = &p;
            err  = errno;
        }
    }

    explicit operator bool() const { return name != nullptr; }
};

bool exists(const std::string & p) {
    struct stat st;
    return lstat(p.c_str(), &st) == 0;
}

// Are a and b two names of one file?
bool same_file(const std::string & a, const std::string & b) {
    struct stat sa, sb;
    return lstat(a.c_str(), &sa) == 0 && lstat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Put the series back as it was before a rotation whose new file has not taken the log's name:
// each LOG.k that was replaced gets its file back from its second name, a LOG.k the shift gave to
// a file that had no LOG.k before is removed (that file is still LOG.k-1), and the second names
// go. The only renames are into names whose own step succeeded, never into the one whose step
// failed. Every step is tried; false (*left: the first that failed) if a name is still left, for
// the next rotation to put back first. Nothing is lost either way: each file keeps a name.
bool roll_back(const series_names & n, step_failed & left) {
    for (size_t k = 1; k <= n.keep(); k++) {
        if (exists(n.prev[k])) {
            if (same_file(n.prev[k], n.name[k])) {
                if (unlink(n.prev[k].c_str()) != 0) {  // LOG.k was not replaced
                    left(n.prev[k]);
                }
            } else if (rename(n.prev[k].c_str(), n.name[k].c_str()) != 0) {
                left(n.prev[k]);
            }
        } else if (same_file(n.name[k], n.name[k - 1]) && unlink(n.name[k].c_str()) != 0) {
            left(n.name[k]);
        }
        if (exists(n.next[k]) && unlink(n.next[k].c_str()) != 0) {
            left(n.next[k]);
        }
    }
    return !left;
}

// Names left by a rotation that did not finish (its process died in it, or its roll back could not
// put every file back): with its new file still at LOG.new the series is put back; without it
// that rotation had finished, and its second names go (LOG.keep's old file with them, as it was
// removing that file). False (*left) if a name is still left: the rotation is not tried.
bool finish_cut_rotation(const series_names & n, step_failed & left) {
    if (exists(n.next[0])) {
        return roll_back(n, left);
    }
    for (size_t k = 1; k <= n.keep(); k++) {
        if (exists(n.prev[k]) && unlink(n.prev[k].c_str()) != 0) {
            left(n.prev[k]);
        }
        if (exists(n.next[k]) && unlink(n.next[k].c_str()) != 0) {
            left(n.next[k]);
        }
    }
    return !left;
}

// The rotation's steps, the new file open at LOG.new. First every file gets a second name (link:
// LOG.k.old for LOG.k, LOG.k.new for the file that becomes LOG.k) and nothing in the series moves;
// then each LOG.k, the oldest first, takes its new file in one rename that replaces the old one
// (which keeps its second name), or is removed where no file follows it; LOG.new takes the log's
// name last; then the second names of the old files go, LOG.keep's file with its last name. A
// step that fails, at any point before the last rename, is undone by roll_back without a rename
// into the name whose step failed, so that a name that keeps failing (EIO) fails each try alike
// and moves nothing. 1: done; 0: no file at the log's name (nothing done); -1: failed (*failed),
// every file where it was and LOG.new removed; -2: failed, and a name could not be put back
// (*left): LOG.new stays, so that the next rotation puts the series back first.
int rotate_series(const series_names & n, step_failed & failed, step_failed & left) {
    if (!exists(n.name[0])) {
        return 0;
    }
    for (size_t k = 1; k <= n.keep() && !failed; k++) {
        if (exists(n.name[k]) && link(n.name[k].c_str(), n.prev[k].c_str()) != 0) {
            failed(n.prev[k]);
        }
    }
    for (size_t k = 1; k <= n.keep() && !failed; k++) {
        if (exists(n.name[k - 1]) && link(n.name[k - 1].c_str(), n.next[k].c_str()) != 0) {
            failed(n.next[k]);
        }
    }
    for (size_t k = n.keep(); k >= 1 && !failed; k--) {
        const bool moved = exists(n.next[k]) ? rename(n.next[k].c_str(), n.name[k].c_str()) == 0 :
                                               !exists(n.name[k]) || unlink(n.name[k].c_str()) == 0;
        if (!moved) {
            failed(n.name[k]);
        }
    }
    if (!failed && rename(n.next[0].c_str(), n.name[0].c_str()) != 0) {
        failed(n.name[0]);
    }
    if (failed) {
        if (!roll_back(n, left)) {
            return -2;
        }
        unlink(n.next[0].c_str());  // (one left is removed before the next rotation opens it)
        return -1;
    }
    for (size_t k = 1; k <= n.keep(); k++) {
        if (exists(n.prev[k]) && unlink(n.prev[k].c_str()) != 0) {
            // left: the next rotation removes it first
        }
    }
    return 1;
}

}  // namespace
#endif

namespace {

// The current file, put back unless a new one takes its place: whatever fails or throws during a
// reopen (std::bad_alloc formatting a warning) leaves the log writing to it, with the new file, if
// one was opened, closed.
struct keep_current {
    log_file &    f;
    FILE * const  fp;
    const int64_t file_bytes, dropped_bytes;
#if !defined(_WIN32)
    const dev_t dev;
    const ino_t ino;
#endif
    FILE * opened   = nullptr;  // the new file, while it has not taken the current one's place
    bool   replaced = false;

    explicit keep_current(log_file & file) :
        f(file),
        fp(file.fp),
        file_bytes(file.file_bytes),
        dropped_bytes(file.dropped_bytes)
#if !defined(_WIN32)
        ,
        dev(file.dev),
        ino(file.ino)
#endif
    {
    }

    ~keep_current() {
        if (replaced) {
            return;
        }
        if (opened) {
            fclose(opened);
        }
        f.fp = fp;
        f.buf.clear();
        f.buf_records   = 0;
        f.file_bytes    = file_bytes;
        f.dropped_bytes = dropped_bytes;
#if !defined(_WIN32)
        f.dev = dev;
        f.ino = ino;
#endif
    }
};

}  // namespace

bool log_file::reopen(bool rotate) {
    write_buffered();
#if !defined(_WIN32)
    const std::string & at = abs_path;
#else
    const std::string & at = path;
#endif
    keep_current current(*this);
    std::string  why;
    bool         ok;
    if (!(rotate && keep > 0)) {
        ok = open_anew(at, current.opened, why);
    } else if (const char * moved = gone()) {
        // A file no longer at the path (removed, or moved aside without SIGHUP) is not rotated, and
        // no kept file moves: the path is opened anew, as a reopen does.
        fail(LLAMA_INSTR_ERR_IO, "the log " + path + " " + moved + ": its records are lost");
        ok = open_anew(at, current.opened, why);
    } else {
        ok = rotate_files(at, current.opened, why);
    }
    if (!ok) {
        // one warning for a failure, none for those that follow it until a new file is started
        if (!reopen_warned) {
            warn(why + ": writing on to the file open");
            reopen_warned = true;
        }
        return false;
    }
    current.replaced = true;
    fclose(current.fp);  // its lines are written (or dropped, counted): nothing is buffered in it
    reopen_warned = false;
    if (suspended) {
        suspended = false;
        resuming  = true;  // said by the first write that succeeds
    }
    return true;
}

bool log_file::open_anew(const std::string & at, FILE *& opened, std::string & why) {
    if (!open_at(at)) {
        const int err = errno;
        why           = "cannot open the log " + path + " anew: " + strerror(err);
        return false;
    }
    opened = fp;
    return true;
}

bool log_file::rotate_files(const std::string & at, FILE *& opened, std::string & why) {
#if !defined(_WIN32)
    // Every name is made before the new file is opened: from the open until the files are
    // where they stay, nothing allocates. The new file is opened first, under LOG.new, and
    // the files move only once it is: a failed open (no descriptor left, EMFILE) leaves every
    // file where it is, and writing goes on into the current one, rotated at a later try.
    const series_names n(at, keep);
    step_failed        step, left;
    if (!finish_cut_rotation(n, left)) {
        why = "cannot rotate the log " + path + ": " + *left.name + ", left by a rotation that did not " +
              "finish, cannot be put back: " + strerror(left.err);
        return false;
    }
    if (unlink(n.next[0].c_str()) != 0 && errno != ENOENT) {
        const int err = errno;
        why           = "cannot rotate the log " + path + ": " + n.next[0] + ": " + strerror(err);
        return false;
    }
    if (!open_at(n.next[0])) {
        const int err = errno;
        why           = "cannot rotate the log " + path + ": " + strerror(err);
        return false;
    }
    opened       = fp;
    const int rc = rotate_series(n, step, left);
    if (rc < 0) {
        why = "cannot rotate the log " + path + ": " + *step.name + ": " + strerror(step.err);
        if (rc == -2) {
            why += std::string("; ") + *left.name + ": " + strerror(left.err) + " (put back at the next try)";
        }
        return false;
    }
    if (rc == 0) {
        // nothing at the path (the file moved away meanwhile): opened anew there
        FILE * const tmp = fp;
        opened           = nullptr;
        fclose(tmp);
        unlink(n.next[0].c_str());
        return open_anew(at, opened, why);
    }
    return true;
#else
    (void) at;
    (void) opened;
    why = "cannot rotate the log " + path + ": rotation needs hard links, not built for Windows";
    return false;
#endif
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
