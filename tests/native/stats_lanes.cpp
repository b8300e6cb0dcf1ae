// The value statistics' SIMD lanes (llama-instr-stats.cpp): each of lanes_sse2 and lanes_avx
// (where the CPU runs it) makes exactly what lanes_scalar makes of the same block, and accumulate
// exactly what the one-value-at-a-time lanes made of a run (the reference below, the statistics'
// code before the SIMD lanes), bit for bit: runs of every length around the 8-value lanes and the
// 512-value blocks, signed zeros, subnormals, large values, and blocks with a NaN or an infinity.
// tests/test_native_units.py builds it against the patched tree.
#include "check.h"
#include "llama-instr-stats.cpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace llama_instr;

// accumulate as it was, each lane one value at a time
static void accumulate_reference(stat_partial & a, const float * x, int64_t len) {
    constexpr int     L = 8;
    constexpr int64_t B = 512;
    for (int64_t b0 = 0; b0 < len; b0 += B) {
        const float * y = x + b0;
        const int64_t m = std::min(B, len - b0);
        float         mn[L], mx[L];
        double        s1[L], s2[L];
        for (int k = 0; k < L; k++) {
            mn[k] = INFINITY;
            mx[k] = -INFINITY;
            s1[k] = 0.0;
            s2[k] = 0.0;
        }
        int64_t i = 0;
        for (; i + L <= m; i += L) {
            for (int k = 0; k < L; k++) {
                const float v = y[i + k];
                mn[k]         = v < mn[k] ? v : mn[k];
                mx[k]         = v > mx[k] ? v : mx[k];
                s1[k] += v;
                s2[k] += (double) v * v;
            }
        }
        for (; i < m; i++) {
            const float v = y[i];
            mn[0]         = v < mn[0] ? v : mn[0];
            mx[0]         = v > mx[0] ? v : mx[0];
            s1[0] += v;
            s2[0] += (double) v * v;
        }
        float  bmn = INFINITY, bmx = -INFINITY;
        double t1 = 0.0, t2 = 0.0;
        for (int k = 0; k < L; k++) {
            bmn = std::min(bmn, mn[k]);
            bmx = std::max(bmx, mx[k]);
            t1 += s1[k];
            t2 += s2[k];
        }
        if (std::isfinite(t2)) {
            a.mn = std::min(a.mn, bmn);
            a.mx = std::max(a.mx, bmx);
            a.sum += t1;
            a.sum2 += t2;
            a.n += m;
            continue;
        }
        for (int64_t j = 0; j < m; j++) {
            const float v = y[j];
            if (std::isnan(v)) {
                a.n_nan++;
            } else if (std::isinf(v)) {
                a.n_inf++;
            } else {
                a.mn = std::min(a.mn, v);
                a.mx = std::max(a.mx, v);
                a.sum += v;
                a.sum2 += (double) v * v;
                a.n++;
            }
        }
    }
}

static bool same_bits(const void * a, const void * b, size_t n) {
    return memcmp(a, b, n) == 0;
}

static bool same_partial(const stat_partial & a, const stat_partial & b) {
    return same_bits(&a.mn, &b.mn, sizeof a.mn) && same_bits(&a.mx, &b.mx, sizeof a.mx) &&
           same_bits(&a.sum, &b.sum, sizeof a.sum) && same_bits(&a.sum2, &b.sum2, sizeof a.sum2) && a.n == b.n &&
           a.n_nan == b.n_nan && a.n_inf == b.n_inf;
}

static block_lanes fresh() {
    block_lanes l;
    for (int k = 0; k < 8; k++) {
        l.mn[k] = INFINITY;
        l.mx[k] = -INFINITY;
        l.s1[k] = 0.0;
        l.s2[k] = 0.0;
    }
    return l;
}

// values of every kind a tensor holds: ordinary, signed zeros, subnormals, large
static std::vector<float> values(std::mt19937 & rng, int64_t n, int kind) {
    std::normal_distribution<float>    normal(0.0f, kind == 2 ? 1e18f : 3.0f);
    std::uniform_int_distribution<int> pick(0, 7);
    std::vector<float>                 x(n);
    for (auto & v : x) {
        v = normal(rng);
        if (kind == 1) {
            const int p = pick(rng);
            v           = p == 0 ? 0.0f : p == 1 ? -0.0f : p == 2 ? 1e-40f : p == 3 ? -1e-42f : v;
        }
    }
    return x;
}

int main() {
    std::mt19937          rng(42);
    int                   checked = 0;
    // the lanes alone: each SIMD lanes function against the scalar one
    std::vector<lanes_fn> simd;
#if defined(__SSE2__) || defined(_M_X64)
    simd.push_back(lanes_sse2);
#endif
#ifdef LLAMA_INSTR_STATS_AVX
    if (__builtin_cpu_supports("avx")) {
        simd.push_back(lanes_avx);
    }
#endif
    for (int kind = 0; kind < 3; kind++) {
        for (int64_t n8 : { 0, 8, 16, 64, 504, 512 }) {
            const std::vector<float> x    = values(rng, n8, kind);
            block_lanes              want = fresh();
            lanes_scalar(want, x.data(), n8);
            for (lanes_fn f : simd) {
                block_lanes got = fresh();
                f(got, x.data(), n8);
                CHECK(same_bits(&got, &want, sizeof got));
                checked++;
            }
        }
    }
    // accumulate against the reference, over runs of every length and blocks that
    // are redone
    for (int kind = 0; kind < 3; kind++) {
        for (int64_t len : { 0, 1, 7, 8, 9, 63, 511, 512, 513, 1000, 1024, 1031, 4099 }) {
            for (int special = 0; special < 4; special++) {
                std::vector<float> x = values(rng, len, kind);
                if (len > 0 && special == 1) {
                    x[len / 2] = NAN;
                } else if (len > 0 && special == 2) {
                    x[len - 1] = -INFINITY;
                } else if (len > 600 && special == 3) {
                    x[3]   = INFINITY;
                    x[600] = NAN;
                }
                stat_partial got  = { INFINITY, -INFINITY, 0.0, 0.0, 0, 0, 0, 0 };
                stat_partial want = got;
                accumulate(got, x.data(), len);
                accumulate_reference(want, x.data(), len);
                CHECK(same_partial(got, want));
                checked++;
            }
        }
    }
    printf("%d checked, %zu SIMD lanes\n", checked, simd.size());
    return 0;
}
