#include "llama-instr-testing.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__GLIBC__)
#    include <dlfcn.h>
#    include <execinfo.h>
#endif

namespace {

std::atomic<int64_t> g_fail_at{ 0 };  // 0: disarmed
std::atomic<int64_t> g_seen{ 0 };
std::atomic<int64_t> g_failed{ 0 };

thread_local bool t_inside = false;  // backtrace() and dladdr() may allocate themselves

#if defined(__GLIBC__)
// Is the code at `pc` in a llama_instr function (C API, hook or internal, all exported from
// libllama)? dladdr is slow: the answers are cached per thread, direct-mapped by address.
bool in_llama_instr(void * pc) {
    constexpr size_t           N = 4096;
    thread_local uintptr_t     keys[N];
    thread_local unsigned char vals[N];
    const uintptr_t            a    = (uintptr_t) pc;
    const size_t               slot = (a >> 2) % N;
    if (keys[slot] == a) {
        return vals[slot];
    }
    Dl_info    info;
    const bool yes =
        dladdr(pc, &info) && info.dli_sname &&
        (strncmp(info.dli_sname, "llama_instr_", 12) == 0 || strncmp(info.dli_sname, "_ZN11llama_instr", 16) == 0) &&
        strncmp(info.dli_sname, "llama_instr_test_", 17) != 0;
    keys[slot] = a;
    vals[slot] = yes;
    return yes;
}
#endif

// Is a llama_instr function on the stack?
bool for_llama_instr() {
#if defined(__GLIBC__)
    void *    frames[48];
    const int n = backtrace(frames, 48);
    for (int i = 1; i < n; i++) {
        if (in_llama_instr(frames[i])) {
            return true;
        }
    }
#endif
    return false;
}

bool inject_failure() {
    if (g_fail_at.load(std::memory_order_relaxed) == 0 || t_inside) {
        return false;
    }
    t_inside      = true;
    const bool us = for_llama_instr();
    t_inside      = false;
    if (!us) {
        return false;
    }
    if (g_seen.fetch_add(1, std::memory_order_relaxed) + 1 == g_fail_at.load(std::memory_order_relaxed)) {
        g_failed.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    return false;
}

void * alloc(std::size_t n) {
    if (inject_failure()) {
        throw std::bad_alloc();
    }
    void * p = std::malloc(n ? n : 1);
    if (!p) {
        throw std::bad_alloc();
    }
    return p;
}

}  // namespace

void llama_instr_test_fail_alloc(int64_t n) {
    g_fail_at.store(0, std::memory_order_relaxed);
    g_seen.store(0, std::memory_order_relaxed);
    g_failed.store(0, std::memory_order_relaxed);
    g_fail_at.store(n, std::memory_order_relaxed);
}

int64_t llama_instr_test_failed_allocs(void) {
    return g_failed.load(std::memory_order_relaxed);
}

// The replaced global allocation functions (the aligned and nothrow forms keep the defaults, which
// llama_instr code does not use).
void * operator new(std::size_t n) {
    return alloc(n);
}

void * operator new[](std::size_t n) {
    return alloc(n);
}

void operator delete(void * p) noexcept {
    std::free(p);
}

void operator delete[](void * p) noexcept {
    std::free(p);
}

void operator delete(void * p, std::size_t) noexcept {
    std::free(p);
}

void operator delete[](void * p, std::size_t) noexcept {
    std::free(p);
}
