// A native backtrace when a process dies of a signal, for bench/gpu_check.sh on a machine with no
// debugger (the GPU machine has no gdb): preloaded (LD_PRELOAD), it prints the faulting thread's
// frames, each as "library+offset (symbol+offset)", to stderr, then lets the signal kill the
// process as before. Under Python's faulthandler (python -X faulthandler) Python's frames come
// first: faulthandler dumps them, then re-raises the signal to this handler. The offsets resolve
// against the same libraries elsewhere: addr2line -f -C -e LIBRARY OFFSET (a return address's
// offset, as printed, is one past its call).
//
//   gcc -shared -fPIC -O1 bench/segv_trace.c -o segv_trace.so

#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char g_stack[1 << 16];

static void put(const char * s) {
    ssize_t r = write(2, s, strlen(s));
    (void) r;
}

static void on_signal(int sig, siginfo_t * info, void * uctx) {
    (void) uctx;
    char line[512];
    // the faulting address when the kernel raised it (faulthandler's re-raise has none)
    if (info && info->si_code > 0) {
        snprintf(line, sizeof line, "### native crash: signal %d at %p, thread %ld\n", sig, info->si_addr,
                 (long) syscall(SYS_gettid));
    } else {
        snprintf(line, sizeof line, "### native crash: signal %d, thread %ld\n", sig, (long) syscall(SYS_gettid));
    }
    put(line);
    void *    frames[64];
    const int n = backtrace(frames, 64);
    // frame 1 returns into the signal trampoline: a frame after a return into it (this signal's,
    // or the first one's, re-raised by Python's faulthandler) is where the thread was interrupted
    const void * trampoline = n > 1 ? frames[1] : NULL;
    for (int i = 0; i < n; i++) {
        // a return address is one past its call, which may be a noreturn function's last
        // instruction (abort's caller): its symbol is looked up one byte before it; an
        // interrupted instruction is looked up where it is (a function's first, say)
        const uintptr_t pc    = (uintptr_t) frames[i];
        const int       exact = i == 0 || frames[i - 1] == trampoline;
        Dl_info         d;
        if (dladdr((void *) (exact ? pc : pc - 1), &d) && d.dli_fname) {
            snprintf(line, sizeof line, "###   #%d %s+0x%lx (%s+0x%lx)\n", i, d.dli_fname,
                     (unsigned long) (pc - (uintptr_t) d.dli_fbase), d.dli_sname ? d.dli_sname : "?",
                     (unsigned long) (d.dli_saddr ? pc - (uintptr_t) d.dli_saddr : 0));
        } else {
            snprintf(line, sizeof line, "###   #%d %p\n", i, frames[i]);
        }
        put(line);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    stack_t st = { 0 };
    st.ss_sp   = g_stack;
    st.ss_size = sizeof g_stack;
    sigaltstack(&st, NULL);
    void * warm[1];
    backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags     = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        sigaction(sigs[i], &sa, NULL);
    }
}
