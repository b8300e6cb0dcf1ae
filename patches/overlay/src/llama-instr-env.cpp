// llamacpp-instr: the session LLAMA_INSTR_LOG opens (see llama-instr-env.h). Only the public API
// of include/llama-instr.h is used, so this file knows nothing of the session's internals.

#include "llama-instr-env.h"

#include "llama-instr-json.h"
#include "llama-instr.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#if defined(__unix__) || (defined(__APPLE__) && defined(__MACH__))
#    define LLAMA_INSTR_ENV_POSIX 1
#    include <fcntl.h>
#    include <poll.h>
#    include <pthread.h>
#    include <signal.h>
#    include <unistd.h>
#endif

namespace {

std::atomic<bool> g_checked{ false };         // the environment was read (at the first context)
std::mutex        g_mtx;                      // guards g_open and the end of the session
bool              g_open = false;             // the session this file opened is still open
std::atomic<bool> g_recording_load{ false };  // model_loading turned transfer recording on for it

const char * const k_prefix = "llama-instr: ";

void warn(const std::string & msg) {
    // one line, then the program goes on uninstrumented
    fprintf(stderr, "%s%s\n", k_prefix, msg.c_str());
    fflush(stderr);
}

bool parse_level(const char * v, int32_t & level) {
    std::string s(v);
    for (auto & c : s) {
        c = (char) tolower((unsigned char) c);
    }
    if (s == "minimal" || s == "1") {
        level = LLAMA_INSTR_LEVEL_MINIMAL;
    } else if (s == "detailed" || s == "2") {
        level = LLAMA_INSTR_LEVEL_DETAILED;
    } else if (s == "verbose" || s == "3") {
        level = LLAMA_INSTR_LEVEL_VERBOSE;
    } else {
        return false;
    }
    return true;
}

bool parse_int(const char * v, long lo, long hi, int32_t & out) {
    char * end = nullptr;
    errno      = 0;
    long n     = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi) {
        return false;
    }
    out = (int32_t) n;
    return true;
}

// A size in bytes with an optional K, M or G suffix (KiB, MiB, GiB): "64M".
bool parse_size(const char * v, int64_t & out) {
    char * end  = nullptr;
    errno       = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || n < 0) {
        return false;
    }
    int shift = 0;
    switch (*end) {
        case 'K':
        case 'k':
            shift = 10;
            end++;
            break;
        case 'M':
        case 'm':
            shift = 20;
            end++;
            break;
        case 'G':
        case 'g':
            shift = 30;
            end++;
            break;
        default:
            break;
    }
    if (*end != '\0' || n > (INT64_MAX >> shift)) {
        return false;
    }
    out = (int64_t) n << shift;
    return true;
}

// Does a command-line word name an option whose value is a secret (llama-server's API keys, the
// Hugging Face token)? llama.cpp reads "--a_b" as "--a-b".
bool names_secret(std::string word) {
    if (word.compare(0, 2, "--") == 0) {
        std::replace(word.begin(), word.end(), '_', '-');
    }
    return word == "--api-key" || word == "--hf-token" || word == "-hft";
}

// {"program":"llama-server","argv":[...],"opened_by":"LLAMA_INSTR_LOG"}: the command line as the
// kernel has it (/proc/self/cmdline, NUL-separated), so no program needs to pass it in. A log is
// kept and handed on: a secret's value is written "***", its option's name kept, so that a reader
// sees it was given. --api-key-file names a path, which is kept.
std::string metadata() {
    std::string           buf;
    llama_instr::json_out j{ buf };
    std::string           cmdline;
    FILE *                f = fopen("/proc/self/cmdline", "rb");
    if (f) {
        char   chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
            cmdline.append(chunk, n);
        }
        fclose(f);
    }
    std::string program;
    j.ch('{');
    j.key("argv");
    j.ch('[');
    size_t a      = 0;
    bool   secret = false;  // this word is the value of the word before
    while (a < cmdline.size()) {
        size_t b = cmdline.find('\0', a);
        if (b == std::string::npos) {
            b = cmdline.size();
        }
        std::string arg = cmdline.substr(a, b - a);
        if (program.empty()) {
            const size_t slash = arg.rfind('/');
            program            = slash == std::string::npos ? arg : arg.substr(slash + 1);
        }
        const size_t eq = arg.find('=');
        if (secret) {
            arg = "***";
        } else if (eq != std::string::npos && names_secret(arg.substr(0, eq))) {
            arg = arg.substr(0, eq + 1) + "***";  // (not llama.cpp's form: its value hidden all the same)
        }
        secret = !secret && names_secret(arg);
        j.sep();
        j.str(arg);
        a = b + 1;
    }
    j.ch(']');
    j.key("program");
    j.str(program);
    j.key("opened_by");
    j.str("LLAMA_INSTR_LOG");
    j.ch('}');
    return buf;
}

void end_session(const char * status) {
    std::lock_guard<std::mutex> lock(g_mtx);
    if (!g_open) {
        return;
    }
    g_open = false;
    if (llama_instr_session_end(status) != LLAMA_INSTR_OK) {
        warn(std::string("the session log is incomplete: ") + llama_instr_last_error());
    }
}

#ifdef LLAMA_INSTR_ENV_POSIX

// Signals: the program's handlers stay in charge. A watcher thread (which blocks every signal, so
// the kernel keeps delivering them to the program's own threads) wraps whatever handler SIGINT and
// SIGTERM have, now and whenever the program installs a new one (llama-server does so after
// loading the model). The wrapper is async-signal-safe: it stores the signal number and calls the
// program's handler; where the program left the default action (terminate), it instead wakes the
// watcher through a pipe, which ends the session and then re-raises the signal with the default
// action restored, so the process dies of it exactly as it would have.
//
// SIGHUP reopens the log (logrotate): the wrapper only sets the library's flag
// (llama_instr_reopen) and calls the program's own handler if it has one, so SIGHUP does not end
// the process while the session is open.
//
// SIGUSR1 switches the level between MINIMAL and the level the session opened at (DETAILED when
// that was MINIMAL), so that an operator can look closer at a live server and back: the wrapper
// wakes the watcher, which sets the level (llama_instr_set_level takes a lock, so not in the
// handler); every step begun after it is recorded at the new level, as its step_begin says.

const int             k_n_signals            = 4;
const int             k_signals[k_n_signals] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1 };
struct sigaction      g_prev[k_n_signals];  // the program's handler, which ours calls
volatile sig_atomic_t g_signal  = 0;
int                   g_pipe[2] = { -1, -1 };
pthread_t             g_watcher;
bool                  g_watching = false;
std::atomic<bool>     g_stop{ false };
const int             k_poll_ms  = 50;
int32_t               g_level_up = LLAMA_INSTR_LEVEL_DETAILED;  // SIGUSR1's other level; set before the watcher starts

int signal_index(int signo) {
    return signo == SIGINT ? 0 : signo == SIGTERM ? 1 : signo == SIGHUP ? 2 : signo == SIGUSR1 ? 3 : -1;
}

// Signals that leave the process running: the library's part, then the program's handler, if any.
bool kept_running(int signo) {
    return signo == SIGHUP || signo == SIGUSR1;
}

void on_signal(int signo, siginfo_t * info, void * uctx) {
    const int saved = errno;
    const int i     = signal_index(signo);
    if (kept_running(signo)) {
        if (signo == SIGHUP) {
            llama_instr_reopen();  // a flag: the log is reopened between steps
        } else {
            const char c = (char) signo;
            if (write(g_pipe[1], &c, 1) < 0) {
                // the pipe is full or gone: this switch is lost, the session goes on as it was
            }
        }
        const struct sigaction & prev = g_prev[i];
        if (prev.sa_flags & SA_SIGINFO) {
            if (prev.sa_sigaction) {
                prev.sa_sigaction(signo, info, uctx);
            }
        } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
            prev.sa_handler(signo);
        }
        errno = saved;
        return;
    }
    g_signal = signo;
    if (i >= 0) {
        const struct sigaction & prev = g_prev[i];
        if (prev.sa_flags & SA_SIGINFO) {
            if (prev.sa_sigaction) {
                prev.sa_sigaction(signo, info, uctx);
            }
        } else if (prev.sa_handler == SIG_DFL) {
            const char c = (char) signo;
            if (write(g_pipe[1], &c, 1) < 0) {
                // the pipe is gone (exiting): nothing else is safe to do here
            }
        } else if (prev.sa_handler != SIG_IGN) {
            prev.sa_handler(signo);
        }
    }
    errno = saved;
}

bool is_ours(const struct sigaction & sa) {
    return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == on_signal;
}

// Wrap the current handler of each signal unless it is ours already or the signal is ignored
// (SIGHUP and SIGUSR1 are wrapped even then: nohup'd servers are rotated too).
void wrap_handlers() {
    for (int i = 0; i < k_n_signals; i++) {
        struct sigaction cur;
        if (sigaction(k_signals[i], nullptr, &cur) != 0 || is_ours(cur)) {
            continue;
        }
        if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN && !kept_running(k_signals[i])) {
            continue;
        }
        g_prev[i]           = cur;
        struct sigaction sa = cur;  // the program's mask and flags (no SA_RESTART stays none)
        sa.sa_flags |= SA_SIGINFO;
        sa.sa_sigaction = on_signal;
        sigaction(k_signals[i], &sa, nullptr);
    }
}

// SIGUSR1's switch, on the watcher's thread; one line on stderr says where it went.
void switch_level() {
    const int32_t now  = llama_instr_get_level();
    const int32_t next = now > LLAMA_INSTR_LEVEL_MINIMAL ? LLAMA_INSTR_LEVEL_MINIMAL : g_level_up;
    if (now == LLAMA_INSTR_LEVEL_OFF || llama_instr_set_level(next) < 0) {
        return;  // the session has ended (or is ending)
    }
    static const char * const names[] = { "off", "minimal", "detailed", "verbose" };
    warn(std::string("SIGUSR1: recording at ") + names[next] + " from the next step");
}

void * watch(void *) {
    while (!g_stop.load()) {
        struct pollfd p = { g_pipe[0], POLLIN, 0 };
        if (poll(&p, 1, k_poll_ms) > 0) {
            char c = 0;
            if (read(g_pipe[0], &c, 1) == 1 && c == SIGUSR1) {
                switch_level();
            } else if (c != 0) {
                // a signal whose default action ends the process: end the session first
                end_session("interrupted");
                const int        i = signal_index(c);
                struct sigaction sa;
                memset(&sa, 0, sizeof(sa));
                sa.sa_handler = SIG_DFL;
                if (i >= 0) {
                    sa = g_prev[i];
                }
                sigaction(c, &sa, nullptr);
                kill(getpid(), c);
                return nullptr;
            }
        }
        if (!g_stop.load()) {
            wrap_handlers();
        }
    }
    return nullptr;
}

bool start_watcher() {
    if (pipe(g_pipe) != 0) {
        return false;
    }
    for (int fd : g_pipe) {
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
    // the handlers are wrapped before the watcher starts, which wraps them from then on: g_prev is
    // written by one thread at a time (the thread's creation orders this thread's writes before
    // the watcher's). Wrapped after it, a handler the program changed later (Python restores
    // SIGINT's at exit) had the watcher write g_prev with no order to this thread's writes: a
    // data race under ThreadSanitizer
    wrap_handlers();
    // the watcher inherits this mask: it never takes a signal meant for the program
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    g_watching = pthread_create(&g_watcher, nullptr, watch, nullptr) == 0;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (!g_watching) {
        // no watcher to end the session and re-raise: the program's own handlers back
        for (int i = 0; i < k_n_signals; i++) {
            struct sigaction cur;
            if (sigaction(k_signals[i], nullptr, &cur) == 0 && is_ours(cur)) {
                sigaction(k_signals[i], &g_prev[i], nullptr);
            }
        }
    }
    return g_watching;
}

void stop_watcher() {
    if (!g_watching) {
        return;
    }
    g_stop.store(true);
    const char c = 0;
    if (write(g_pipe[1], &c, 1) < 0) {
        // the watcher sees g_stop within one poll period anyway
    }
    pthread_join(g_watcher, nullptr);
    g_watching = false;
}

bool interrupted() {
    return g_signal != 0;
}

#else

bool start_watcher() {
    return true;
}

void stop_watcher() {}

bool interrupted() {
    return false;
}

#endif

// The session ends as the program does: "interrupted" by a signal, "error" when it exits with a
// failure status (llama-bench that could not create a context), else "ok". glibc's on_exit gives
// the status; with atexit alone, a program that fails ends its session "ok".
void end_at_exit(int status) {
    stop_watcher();
    end_session(interrupted() ? "interrupted" : status != 0 ? "error" : "ok");
}

#if defined(__GLIBC__)
void at_exit_status(int status, void *) {
    end_at_exit(status);
}
#else
void at_exit() {
    end_at_exit(0);
}
#endif

void open_from_env(llama_context * ctx) {
    const char * path = getenv("LLAMA_INSTR_LOG");
    if (!path || !*path) {
        return;
    }
    int32_t      level   = LLAMA_INSTR_LEVEL_DETAILED;
    const char * level_s = getenv("LLAMA_INSTR_LEVEL");
    if (level_s && *level_s && !parse_level(level_s, level)) {
        warn(std::string("LLAMA_INSTR_LEVEL=") + level_s +
             " is not a level (minimal, detailed or verbose): running uninstrumented");
        return;
    }
    const char * topk_s = getenv("LLAMA_INSTR_TOPK");
    if (topk_s && *topk_s) {
        int32_t k = 0;
        if (!parse_int(topk_s, 1, 1000, k) || llama_instr_set_topk(k) != LLAMA_INSTR_OK) {
            warn(std::string("LLAMA_INSTR_TOPK=") + topk_s + " is not a number from 1 to 1000: running uninstrumented");
            return;
        }
    }
    // always on: sampling and bounded files
    int32_t sample[2] = { 1, 1 };
    for (int i = 0; i < 2; i++) {
        const char * name = i == 0 ? "LLAMA_INSTR_SAMPLE" : "LLAMA_INSTR_SAMPLE_REQUESTS";
        const char * v    = getenv(name);
        if (v && *v && !parse_int(v, 1, 1000000, sample[i])) {
            warn(std::string(name) + "=" + v + " is not a number from 1 to 1000000: running uninstrumented");
            return;
        }
    }
    int64_t      max_bytes   = 0;
    int32_t      keep        = 0;
    const char * max_bytes_s = getenv("LLAMA_INSTR_MAX_BYTES");
    const char * keep_s      = getenv("LLAMA_INSTR_KEEP");
    if (max_bytes_s && *max_bytes_s) {
        if (!parse_size(max_bytes_s, max_bytes) || max_bytes < 64 * 1024) {
            warn(std::string("LLAMA_INSTR_MAX_BYTES=") + max_bytes_s +
                 " is not a size of at least 64K (bytes, or with a K, M or G suffix): running uninstrumented");
            return;
        }
        keep = 8;
        if (keep_s && *keep_s && !parse_int(keep_s, 1, 1000, keep)) {
            warn(std::string("LLAMA_INSTR_KEEP=") + keep_s + " is not a number from 1 to 1000: running uninstrumented");
            return;
        }
    } else if (keep_s && *keep_s) {
        warn(
            "LLAMA_INSTR_KEEP needs LLAMA_INSTR_MAX_BYTES (the size at which the log rotates): running "
            "uninstrumented");
        return;
    }
    if (llama_instr_set_sampling(sample[0], sample[1]) != LLAMA_INSTR_OK ||
        llama_instr_set_rotation(max_bytes, keep) != LLAMA_INSTR_OK) {
        warn(std::string(llama_instr_last_error()) + ": running uninstrumented");
        return;
    }
    std::lock_guard<std::mutex> lock(g_mtx);
    const std::string           meta = metadata();
    const int32_t               rc   = llama_instr_session_begin(ctx, path, level, meta.c_str());
    if (rc != LLAMA_INSTR_OK) {
        warn(std::string("LLAMA_INSTR_LOG=") + path + ": " + llama_instr_last_error() + ": running uninstrumented");
        return;
    }
    g_open = true;
#ifdef LLAMA_INSTR_ENV_POSIX
    g_level_up = level > LLAMA_INSTR_LEVEL_MINIMAL ? level : LLAMA_INSTR_LEVEL_DETAILED;
#endif
    // registered after the session's own state exists, so it runs before that state is destroyed
#if defined(__GLIBC__)
    on_exit(at_exit_status, nullptr);
#else
    atexit(at_exit);
#endif
    if (!start_watcher()) {
        warn("cannot watch SIGINT/SIGTERM/SIGHUP/SIGUSR1: an interrupted run will end its session as ok");
    }
}

}  // namespace

void llama_instr_env_model_loading() {
    if (g_checked.load(std::memory_order_relaxed)) {
        return;  // the session opened (or not) at the first context already
    }
    static std::once_flag once;
    std::call_once(once, [] {
        const char * path = getenv("LLAMA_INSTR_LOG");
        if (path && *path) {
            // without an RPC backend there is nothing to record
            g_recording_load.store(llama_instr_record_transfers(1) == LLAMA_INSTR_OK, std::memory_order_relaxed);
        }
    });
}

void llama_instr_env_context_created(llama_context * ctx) {
    if (g_checked.load(std::memory_order_relaxed)) {
        return;
    }
    static std::once_flag once;
    std::call_once(once, [ctx] {
        try {
            open_from_env(ctx);
        } catch (...) {
            warn("could not open the session of LLAMA_INSTR_LOG: running uninstrumented");
        }
        bool opened = false;
        {
            std::lock_guard<std::mutex> lock(g_mtx);
            opened = g_open;
        }
        if (!opened && g_recording_load.load(std::memory_order_relaxed)) {
            // the model's upload was recorded for a session that did not open: drop it and stop
            // (otherwise up to 262,144 rows stay, and go into a later session's log)
            llama_instr_record_transfers(0);
        }
        g_checked.store(true, std::memory_order_relaxed);
    });
}

llama_instr::device_env llama_instr::env_device(uint64_t session_epoch) {
    // the session's epoch and the four switches in one word (bit 0: timing, bit 1: fence, bit 2:
    // step memory, bit 3: value statistics, bit 4: read), so that a reader never pairs one
    // session's epoch with another's switches; the environment is read under the lock only
    static std::atomic<uint64_t> cached{ 0 };
    static std::mutex            mtx;
    const uint64_t               want = (session_epoch << 5) | 16;
    uint64_t                     v    = cached.load(std::memory_order_acquire);
    if ((v & ~(uint64_t) 15) != want) {
        std::lock_guard<std::mutex> lock(mtx);
        v = cached.load(std::memory_order_relaxed);
        if ((v & ~(uint64_t) 15) != want) {
            const char * off    = getenv("LLAMA_INSTR_DEVICE_TIMING");
            const char * clock  = getenv("LLAMA_INSTR_DEVICE_CLOCK");
            const char * memory = getenv("LLAMA_INSTR_STEP_MEMORY");
            const char * values = getenv("LLAMA_INSTR_VALUE_STATS");
            v = want | (off && strcmp(off, "0") == 0 ? 0 : 1) | (clock && strcmp(clock, "fence") == 0 ? 2 : 0) |
                (memory && strcmp(memory, "0") == 0 ? 0 : 4) | (values && strcmp(values, "1") == 0 ? 8 : 0);
            cached.store(v, std::memory_order_release);
        }
    }
    device_env e;
    e.timing      = (v & 1) != 0;
    e.clock_fence = (v & 2) != 0;
    e.step_memory = (v & 4) != 0;
    e.value_stats = (v & 8) != 0;
    return e;
}
