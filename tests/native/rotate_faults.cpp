// The session log's rotation (log_file::reopen, keep = 3, a full series) under faults, at each of
// its steps in turn. The steps (link, rename, unlink: the names a rotation makes and removes) are
// libllama's calls to the C library, which this program's definitions below take over; the
// allocations are this program's operator new. Each case starts from the same folder: LOG open
// holding one record, LOG.1 .. LOG.3 with contents of their own.
//   fail:  step i fails (EIO), and with `persist` every later step into the same name too (a name
//          that keeps failing): the rotation fails with every file where it was, no name left, one
//          warning however often it is tried; or, a step after the new file took the log's name,
//          it succeeds. Either way the next rotation, faults gone, rotates the series whole.
//   crash: the process dies at step i (a child, forked): the next rotation, by another log_file
//          opening LOG, puts back or finishes what it left, and rotates the series whole.
//   alloc: the n-th allocation in reopen throws std::bad_alloc, for n = 1, 2, ... until reopen runs
//          without it (a rotation that succeeds, one that fails, a reopen): one descriptor open,
//          at the file at LOG, which takes the records written next; the series rotated or not.
//   and a second fault: the roll back itself cannot put a file back (fail_twice).
// Prints "STEPS FAIL_CASES CRASH_CASES ALLOC_CASES" and exits 0 when every case holds.
// tests/test_native_units.py builds it against the patched tree and links the build's libllama.
#include "check.h"
#include "llama-instr-log.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

using llama_instr::log_file;
using files = std::map<std::string, std::string>;  // name in the folder -> content

// --- the steps: link, rename and unlink, counted while armed ------------------------------------

enum class fault { none, fail, crash };

static bool  g_armed   = false;
static int   g_steps   = 0;  // steps seen since armed
static int   g_at      = 0;  // the step that faults (1-based)
static fault g_fault   = fault::none;
static bool  g_persist = false;
static char  g_failing[4096];           // the name whose step failed (persist: later steps into it fail too)
static char  g_then[4096];              // a name whose steps fail once a step has failed (a second fault)

static std::vector<std::string> g_log;  // the steps of a run with no fault: "rename NAME"...

static bool faulted(const char * kind, const char * name) {
    if (!g_armed) {
        return false;
    }
    ++g_steps;
    if (g_fault == fault::none) {
        g_log.push_back(std::string(kind) + " " + name);
        return false;
    }
    if ((g_persist && g_failing[0] && strcmp(name, g_failing) == 0) ||
        (g_failing[0] && g_then[0] && strcmp(name, g_then) == 0)) {
        errno = EIO;
        return true;
    }
    if (g_steps == g_at) {
        if (g_fault == fault::crash) {
            _exit(0);
        }
        snprintf(g_failing, sizeof(g_failing), "%s", name);
        errno = EIO;
        return true;
    }
    return false;
}

template <typename F> static F real(const char * name) {
    return (F) dlsym(RTLD_NEXT, name);
}

extern "C" int rename(const char * from, const char * to) noexcept {
    static const auto fn = real<int (*)(const char *, const char *)>("rename");
    return faulted("rename", to) ? -1 : fn(from, to);
}

extern "C" int link(const char * from, const char * to) noexcept {
    static const auto fn = real<int (*)(const char *, const char *)>("link");
    return faulted("link", to) ? -1 : fn(from, to);
}

extern "C" int unlink(const char * p) noexcept {
    static const auto fn = real<int (*)(const char *)>("unlink");
    return faulted("unlink", p) ? -1 : fn(p);
}

static void arm(fault f, int at, bool persist) {
    g_steps      = 0;
    g_at         = at;
    g_fault      = f;
    g_persist    = persist;
    g_failing[0] = '\0';
    g_then[0]    = '\0';
    g_armed      = true;
}

// --- allocations: the n-th after arming throws, once --------------------------------------------

static long g_allocs   = 0;
static long g_fail_new = 0;  // 0: none fails

void * operator new(std::size_t n) {
    if (g_fail_new > 0 && ++g_allocs == g_fail_new) {
        throw std::bad_alloc();
    }
    void * p = std::malloc(n ? n : 1);
    if (!p) {
        throw std::bad_alloc();
    }
    return p;
}

void operator delete(void * p) noexcept {
    std::free(p);
}

void operator delete(void * p, std::size_t) noexcept {
    std::free(p);
}

// --- the folder ---------------------------------------------------------------------------------

static std::string g_dir, g_log_path;

static std::string name(int k) {
    return k == 0 ? g_log_path : g_log_path + "." + std::to_string(k);
}

static std::string read_file(const std::string & p) {
    std::string s;
    FILE *      f = fopen(p.c_str(), "rb");
    CHECK(f != nullptr);
    char   b[4096];
    size_t n;
    while ((n = fread(b, 1, sizeof(b), f)) > 0) {
        s.append(b, n);
    }
    fclose(f);
    return s;
}

static void write_file(const std::string & p, const std::string & s) {
    FILE * f = fopen(p.c_str(), "wb");
    CHECK(f != nullptr && fwrite(s.data(), 1, s.size(), f) == s.size() && fclose(f) == 0);
}

static files listing() {
    files out;
    DIR * d = opendir(g_dir.c_str());
    CHECK(d != nullptr);
    while (const dirent * e = readdir(d)) {
        if (e->d_name[0] != '.') {
            out[e->d_name] = read_file(g_dir + "/" + e->d_name);
        }
    }
    closedir(d);
    return out;
}

static void clear_folder() {
    for (const auto & f : listing()) {
        CHECK(remove((g_dir + "/" + f.first).c_str()) == 0);
    }
}

static int open_descriptors() {
    int   n = 0;
    DIR * d = opendir("/proc/self/fd");
    CHECK(d != nullptr);
    while (const dirent * e = readdir(d)) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

// the series as names of the folder: LOG, LOG.1 .. LOG.3 with these contents, nothing else
static files series(const std::string & cur, const std::string & k1, const std::string & k2, const std::string & k3) {
    return {
        { "log",   cur },
        { "log.1", k1  },
        { "log.2", k2  },
        { "log.3", k3  }
    };
}

static const std::string C = "{\"c\":0}\n", R = "{\"r\":1}\n";
static const std::string A1 = "{\"kept\":1}\n", A2 = "{\"kept\":2}\n", A3 = "{\"kept\":3}\n";

// LOG open in `f`, holding C; LOG.1 .. LOG.3 holding A1 .. A3
static void start(log_file & f) {
    clear_folder();
    write_file(name(1), A1);
    write_file(name(2), A2);
    write_file(name(3), A3);
    CHECK(f.open(name(0)));
    f.max_bytes = 1 << 20;
    f.keep      = 3;
    f.emit("{\"c\":0}");
    f.write_buffered();
    CHECK(listing() == series(C, A1, A2, A3));
}

// Is `f` writing to the file at LOG? (one record written: it lands there)
static void writes_to_log(log_file & f) {
    struct stat open_st, path_st;
    CHECK(f.fp != nullptr && fstat(fileno(f.fp), &open_st) == 0 && stat(name(0).c_str(), &path_st) == 0);
    CHECK(open_st.st_ino == path_st.st_ino && open_st.st_dev == path_st.st_dev);
    const std::string before = read_file(name(0));
    f.emit("{\"r\":1}");
    f.write_buffered();
    CHECK(read_file(name(0)) == before + R);
}

static int g_stderr = -1;  // stderr while warnings() holds it (a CHECK that fails gives it back)

// stderr back, and what was written to it meanwhile passed on
static void give_back_stderr() {
    if (g_stderr >= 0) {
        fflush(stderr);
        dup2(g_stderr, 2);
        close(g_stderr);
        g_stderr = -1;
        fprintf(stderr, "%s", read_file(g_dir + ".stderr").c_str());
    }
}

// stderr's lines starting "llama-instr:" while fn runs (passed on to stderr)
template <typename F> static int warnings(F fn) {
    fflush(stderr);
    const std::string p  = g_dir + ".stderr";
    const int         fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    g_stderr             = dup(2);
    CHECK(g_stderr >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    fn();
    give_back_stderr();
    const std::string text = read_file(p);
    int               n    = 0;
    for (size_t at = text.find("llama-instr:"); at != std::string::npos; at = text.find("llama-instr:", at + 1)) {
        n++;
    }
    return n;
}

// --- the cases ----------------------------------------------------------------------------------

// Step i fails. A rotation that fails leaves every file where it was, however often it is tried
// with the fault still there, with one warning; one that succeeds rotated the series. Then the
// faults go, and the next rotation rotates it whole.
static void fail_at(int i, bool persist) {
    log_file f;
    start(f);
    bool  ok  = true;
    int   n   = warnings([&] {
        arm(fault::fail, i, persist);
        ok = f.reopen(true);
        if (!ok && persist) {
            for (int again = 0; again < 3; again++) {
                CHECK(!f.reopen(true));
                CHECK(listing() == series(C, A1, A2, A3));
            }
        }
        g_armed = false;
    });
    files now = listing();
    if (ok) {
        // the step that failed came after the new file took the log's name: the old file's
        // second name it was removing is left (the next rotation removes it first)
        const std::string left = strrchr(g_failing, '/') + 1;
        CHECK(now.erase(left) == 1 && left.size() > 6 && left.compare(left.size() - 4, 4, ".old") == 0);
        CHECK(now == series("", C, A1, A2));
        CHECK(n == 0);
    } else {
        CHECK(now == series(C, A1, A2, A3));
        CHECK(n == 1);
    }
    writes_to_log(f);
    g_failing[0] = '\0';
    CHECK(warnings([&] { CHECK(f.reopen(true)); }) == 0);
    CHECK(listing() == (ok ? series("", R, C, A1) : series("", C + R, A1, A2)));
    writes_to_log(f);
    f.close();
}

// The rename into LOG.1 fails, and then every step into LOG.3, which the shift had already
// replaced: the roll back cannot put LOG.3's file back. No file is lost (LOG.3's keeps its second
// name, LOG.3 holds LOG.2's again), LOG.new stays, and each try puts back what it can first and
// moves nothing more, silently; once the faults go, the next try puts LOG.3 back and rotates.
static void fail_twice(int into_1) {
    log_file f;
    start(f);
    const files left = {
        { "log",       C  },
        { "log.1",     A1 },
        { "log.2",     A2 },
        { "log.3",     A2 },
        { "log.3.old", A3 },
        { "log.new",   "" }
    };
    const int n = warnings([&] {
        arm(fault::fail, into_1, true);
        snprintf(g_then, sizeof(g_then), "%s", name(3).c_str());
        CHECK(!f.reopen(true));
        CHECK(listing() == left);
        CHECK(!f.reopen(true));
        CHECK(listing() == left);
        g_armed = false;
    });
    CHECK(n == 1);
    writes_to_log(f);
    CHECK(warnings([&] { CHECK(f.reopen(true)); }) == 0);
    CHECK(listing() == series("", C + R, A1, A2));
    f.close();
}

// The process dies at step i; another log_file opens LOG, writes R and rotates: the series
// rotated once before (the crash came after the new file took the log's name) or not at all,
// then once more, and nothing else left.
static void crash_at(int i, int last_rename) {
    log_file f;
    start(f);
    fflush(stderr);
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        arm(fault::crash, i, false);
        f.reopen(true);
        _exit(3);  // step i never came
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    f.close();
    log_file g;
    CHECK(g.open(name(0)));
    g.max_bytes = 1 << 20;
    g.keep      = 3;
    g.emit("{\"r\":1}");
    g.write_buffered();
    CHECK(g.reopen(true));
    CHECK(listing() == (i > last_rename ? series("", R, C, A1) : series("", C + R, A1, A2)));
    writes_to_log(g);
    g.close();
}

// The n-th allocation in reopen throws (fault: the step into `failing` fails); true when reopen
// made fewer than n.
static bool alloc_at(long n, bool rotate, const char * failing) {
    log_file f;
    start(f);
    const int fds   = open_descriptors();
    bool      threw = false, ok = false;
    warnings([&] {
        if (failing) {
            arm(fault::fail, -1, true);
            snprintf(g_failing, sizeof(g_failing), "%s", failing);
        }
        g_allocs   = 0;
        g_fail_new = n;
        try {
            ok = f.reopen(rotate);
        } catch (const std::bad_alloc &) {
            threw = true;
        }
        g_fail_new = 0;
        g_armed    = false;
    });
    const bool through = g_allocs < n;
    CHECK(open_descriptors() == fds);
    const files now = listing();
    if (ok && rotate) {
        CHECK(now == series("", C, A1, A2));
    } else if (ok) {
        CHECK(now == series(C, A1, A2, A3));  // opened anew at the path: the same file
    } else {
        CHECK(now == series(C, A1, A2, A3));
    }
    CHECK(!through || !threw);
    writes_to_log(f);
    f.close();
    CHECK(open_descriptors() == fds - 1);
    return through;
}

int main(int argc, char ** argv) {
    CHECK(argc == 2);
    g_dir      = argv[1];
    g_log_path = g_dir + "/log";
    atexit(give_back_stderr);

    // the steps of a rotation with no fault
    {
        log_file f;
        start(f);
        arm(fault::none, 0, false);
        CHECK(f.reopen(true));
        g_armed = false;
        CHECK(listing() == series("", C, A1, A2));
        f.close();
    }
    const int n_steps     = g_steps;
    int       last_rename = 0, into_1 = 0;
    for (int i = 0; i < n_steps; i++) {
        if (g_log[i] == "rename " + name(0)) {
            last_rename = i + 1;
        }
        if (g_log[i] == "rename " + name(1)) {
            into_1 = i + 1;
        }
    }
    CHECK(n_steps >= 4 && last_rename > 0 && into_1 > 0);

    int n_fail = 0, n_crash = 0, n_alloc = 0;
    for (int i = 1; i <= n_steps; i++) {
        fail_at(i, false);
        fail_at(i, true);
        n_fail += 2;
    }
    fail_twice(into_1);
    n_fail++;
    for (int i = 1; i <= n_steps; i++) {
        crash_at(i, last_rename);
        n_crash++;
    }
    const std::string log_1 = name(1);
    for (const auto & c : { std::make_pair(true, (const char *) nullptr), std::make_pair(true, log_1.c_str()),
                            std::make_pair(false, (const char *) nullptr) }) {
        for (long n = 1;; n++) {
            n_alloc++;
            if (alloc_at(n, c.first, c.second)) {
                break;
            }
            CHECK(n < 10000);
        }
    }
    printf("%d %d %d %d\n", n_steps, n_fail, n_crash, n_alloc);
    return 0;
}
