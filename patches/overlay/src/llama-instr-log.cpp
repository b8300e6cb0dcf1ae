#include "llama-instr-log.h"

#include "llama-instr-session.h"

#include <cerrno>
#include <cstring>
#include <utility>
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

namespace {

// Renames that can be undone: each moves a file to a name no file has, so that undo() (in reverse
// order) puts every file back where it was. Undone when it goes out of scope uncommitted (an
// exception included).
struct renames {
    std::vector<std::pair<const std::string *, const std::string *>> done;  // (from, to)

    explicit renames(size_t n) { done.reserve(n); }

    ~renames() { undo(); }

    // false (errno set) if `from` could not be moved; ENOENT: there is no such file
    bool move(const std::string & from, const std::string & to) {
        if (rename(from.c_str(), to.c_str()) != 0) {
            return false;
        }
        done.emplace_back(&from, &to);  // (reserved: does not allocate)
        return true;
    }

    void commit() { done.clear(); }

    void undo() noexcept {
        for (size_t i = done.size(); i-- > 0;) {
            if (rename(done[i].second->c_str(), done[i].first->c_str()) != 0) {
                fprintf(stderr, "llama-instr: cannot put %s back at %s: %s\n", done[i].second->c_str(),
                        done[i].first->c_str(), strerror(errno));
            }
        }
        done.clear();
    }
};

bool exists(const std::string & p) {
#if !defined(_WIN32)
    struct stat st;
    return lstat(p.c_str(), &st) == 0;
#else
    FILE * f = fopen(p.c_str(), "rb");
    if (f) {
        fclose(f);
    }
    return f != nullptr;
#endif
}

// The names of a rotated series: `at` and at.1 .. at.keep, and those a rotation uses on the way.
struct series_names {
    std::vector<std::string> kept;     // [k]: at.k (kept[0] unused)
    std::string              aside;    // at.rotating: the file open, on its way to at.1
    std::string              dropped;  // at.dropped: at.keep, on its way out

    series_names(const std::string & at, int32_t keep) : kept((size_t) keep + 1) {
        for (int32_t k = 1; k <= keep; k++) {
            kept[k] = at + "." + std::to_string(k);
        }
        aside   = at + ".rotating";
        dropped = at + ".dropped";
    }
};

// Once a rotation is done: the file it shifted out of the series removed (one left by a failure
// here is removed at the start of the next rotation).
void remove_dropped(const series_names & n) {
    if (remove(n.dropped.c_str()) != 0 && errno != ENOENT) {
        warn("cannot remove " + n.dropped + ": " + strerror(errno) + " (removed at the next rotation)");
    }
}

// Put `newest` at the head of the kept series: at.keep moves to at.dropped (removed once the
// whole rotation is done), at.N to at.N+1 from the oldest down (a missing one skipped), `newest`
// to at.1; each rename into `r`. False (errno set, *failed the file that did not move) when one
// fails.
bool shift_series(renames & r, const series_names & n, const std::string & newest, const std::string ** failed) {
    const int32_t keep = (int32_t) n.kept.size() - 1;
    if (exists(n.kept[keep]) && !r.move(n.kept[keep], n.dropped)) {
        *failed = &n.kept[keep];
        return false;
    }
    for (int32_t k = keep - 1; k >= 1; k--) {
        if (!r.move(n.kept[k], n.kept[k + 1]) && errno != ENOENT) {
            *failed = &n.kept[k];
            return false;
        }
    }
    if (!r.move(newest, n.kept[1])) {
        *failed = &newest;
        return false;
    }
    return true;
}

}  // namespace

int log_file::rotate_files(const std::string & at, const std::string & tmp, std::string & why) {
    const series_names n(at, keep);
    // Names a rotation cut short (a crash) leaves: at.dropped, the oldest kept file it was
    // removing (removed now, as it was to be), and at.rotating, the file that was current then
    // (newer than every kept one, older than the file open): never overwritten, but kept as the
    // newest of the series before the file open joins it.
    if (remove(n.dropped.c_str()) != 0 && errno != ENOENT) {
        why = n.dropped + ": " + strerror(errno);
        return -1;
    }
    if (!exists(at)) {
        return 0;
    }
    const std::string * failed = nullptr;
    if (exists(n.aside)) {
        warn("the log " + n.aside + " was left by a rotation cut short: it is kept as " + n.kept[1]);
        renames r((size_t) keep + 2);
        if (!shift_series(r, n, n.aside, &failed)) {
            const int err = errno;
            r.undo();
            why = *failed + ": " + strerror(err);
            return -1;
        }
        r.commit();
        remove_dropped(n);
    }
    // The file open moves aside, the series shifts, the file joins it and the new file takes the
    // path; if any step fails (or throws) every file goes back to where it was.
    renames r((size_t) keep + 3);
    if (!r.move(at, n.aside)) {
        failed = &at;
    } else if (shift_series(r, n, n.aside, &failed) && !r.move(tmp, at)) {
        failed = &tmp;
    }
    if (failed) {
        const int err = errno;
        r.undo();
        why = *failed + ": " + strerror(err);
        return -1;
    }
    r.commit();
    remove_dropped(n);
    return 1;
}

bool log_file::reopen(bool rotate) {
    write_buffered();
#if !defined(_WIN32)
    const std::string & at = abs_path;
#else
    const std::string & at = path;
#endif
    // the current file, put back when the new one cannot take its place
    FILE * const old = fp;
#if !defined(_WIN32)
    const dev_t old_dev = dev;
    const ino_t old_ino = ino;
#endif
    const int64_t old_bytes = file_bytes, old_dropped = dropped_bytes;
    auto          keep_old = [&](FILE * opened, const std::string & why) {
        warn(why + ": writing on to the file open");
        if (opened) {
            fclose(opened);
        }
        fp = old;
#if !defined(_WIN32)
        dev = old_dev;
        ino = old_ino;
#endif
        file_bytes    = old_bytes;
        dropped_bytes = old_dropped;
        return false;
    };

    if (!(rotate && keep > 0)) {
        if (!open_at(at)) {
            return keep_old(nullptr, "cannot open the log " + path + " anew: " + strerror(errno));
        }
    } else if (const char * moved = gone()) {
        // A file no longer at the path (removed, or moved aside without SIGHUP) is not rotated, and
        // no kept file moves: the path is opened anew, as a reopen does. (Shifting the series
        // first, the rename of the path that then failed lost path.keep at every retry.)
        fail(LLAMA_INSTR_ERR_IO, "the log " + path + " " + moved + ": its records are lost");
        if (!open_at(at)) {
            return keep_old(nullptr, "cannot open the log " + path + " anew: " + strerror(errno));
        }
    } else {
        // The new file is opened first, under a temporary name, and the files are renamed only
        // once it is: a failed open (no descriptor left, EMFILE) leaves every file where it is and
        // writing goes on into the current one, to be rotated at a later try.
        const std::string tmp = at + ".new";
        if (remove(tmp.c_str()) != 0 && errno != ENOENT) {
            return keep_old(nullptr, "cannot rotate the log " + path + ": " + tmp + ": " + strerror(errno));
        }
        if (!open_at(tmp)) {
            return keep_old(nullptr, "cannot rotate the log " + path + ": " + strerror(errno));
        }
        FILE * const opened = fp;
        std::string  why;
        const int    rc = rotate_files(at, tmp, why);
        if (rc < 0) {
            remove(tmp.c_str());
            return keep_old(opened, "cannot rotate the log " + path + ": " + why);
        }
        if (rc == 0) {
            // nothing at the path (the file moved away meanwhile): opened anew there
            remove(tmp.c_str());
            fclose(opened);
            if (!open_at(at)) {
                return keep_old(nullptr, "cannot open the log " + path + " anew: " + strerror(errno));
            }
        }
    }
    fclose(old);  // its lines are written (or dropped, counted): nothing is buffered in it
    if (suspended) {
        suspended = false;
        resuming  = true;  // said by the first write that succeeds
    }
    return true;
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
