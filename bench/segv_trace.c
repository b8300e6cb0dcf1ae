// A native backtrace when a process dies of a signal, for bench/gpu_check.sh on a machine with no
// debugger: preloaded (LD_PRELOAD), it prints each frame as "library+offset (symbol+offset)" to
// stderr, then lets the signal kill the process as before. The offsets resolve against the same
// libraries elsewhere: addr2line -f -C -e LIBRARY OFFSET.
//
//   gcc -shared -fPIC -O1 bench/segv_trace.c -o segv_trace.so

#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_stack[1 << 16];

static void put(const char * s) {
    ssize_t r = write(2, s, strlen(s));
    (void) r;
}

static void on_signal(int sig, siginfo_t * info, void * uctx) {
    (void) uctx;
    char line[512];
    snprintf(line, sizeof line, "### native crash: signal %d at %p\n", sig, info ? info->si_addr : NULL);
    put(line);
    void *    frames[64];
    const int n = backtrace(frames, 64);
    for (int i = 0; i < n; i++) {
        Dl_info d;
        if (dladdr(frames[i], &d) && d.dli_fname) {
            snprintf(line, sizeof line, "###   #%d %s+0x%lx (%s+0x%lx)\n", i, d.dli_fname,
                     (unsigned long) ((uintptr_t) frames[i] - (uintptr_t) d.dli_fbase), d.dli_sname ? d.dli_sname : "?",
                     (unsigned long) (d.dli_saddr ? (uintptr_t) frames[i] - (uintptr_t) d.dli_saddr : 0));
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
