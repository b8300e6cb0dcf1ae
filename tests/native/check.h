// CHECK for the native units: a failed condition prints where and exits 1, which
// tests/test_native_units.py reports with the unit's stderr.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                            \
    do {                                                                    \
        if (!(x)) {                                                         \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #x); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)
