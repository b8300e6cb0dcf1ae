// Allocation failure for the native units: this program's operator new (which the libraries it
// links use too) throws std::bad_alloc at every allocation from the n-th on, once
// fail_allocations_from(n) arms it; fail_allocations_from(0) disarms it. Include it in one file
// of the unit only.
#pragma once

#include <cstdlib>
#include <new>

static long g_seen      = 0;
static long g_fail_from = 0;  // 0: nothing fails

static void fail_allocations_from(long n) {
    g_seen      = 0;
    g_fail_from = n;
}

void * operator new(std::size_t n) {
    if (g_fail_from > 0 && ++g_seen >= g_fail_from) {
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
