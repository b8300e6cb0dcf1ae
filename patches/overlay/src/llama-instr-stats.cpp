#include "llama-instr-stats.h"

#include "llama-instr-experts.h"
#include "llama-instr-graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__) || defined(_M_X64) || (defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)))
#    include <immintrin.h>
#endif

namespace llama_instr {

void stats_buffer::prepare(int32_t cap, int32_t n_threads) {
    max_threads    = std::max<int32_t>(1, n_threads);
    const size_t n = (size_t) cap * (size_t) max_threads;
    if (partials.size() < n) {
        partials.resize(n);
    }
    // a new generation invalidates every slot without touching them
    if (++gen == 0) {
        for (auto & p : partials) {
            p.gen = 0;
        }
        gen = 1;
    }
}

// One block's eight lanes: lane k takes the values k, k + 8, k + 16, ... of the block, in order.
struct block_lanes {
    float  mn[8], mx[8];
    double s1[8], s2[8];
};

// The lanes over the block's first n8 values (a multiple of 8), one value at a time.
[[maybe_unused]] static void lanes_scalar(block_lanes & l, const float * y, int64_t n8) {
    for (int64_t i = 0; i < n8; i += 8) {
        for (int k = 0; k < 8; k++) {
            const float v = y[i + k];
            l.mn[k]       = v < l.mn[k] ? v : l.mn[k];
            l.mx[k]       = v > l.mx[k] ? v : l.mx[k];
            l.s1[k] += v;
            l.s2[k] += (double) v * v;
        }
    }
}

// The same lanes with SIMD registers (the compiler leaves the scalar loop scalar, at about ten
// instructions a value): each lane takes the same values in the same order, min as `v < mn ? v :
// mn` (MINPS returns its second operand unless the first is less), max likewise, and a value's
// square is exact in double, so the lanes hold exactly what lanes_scalar makes of them.
#if defined(__SSE2__) || defined(_M_X64)
static void lanes_sse2(block_lanes & l, const float * y, int64_t n8) {
    __m128  mn0 = _mm_loadu_ps(l.mn), mn1 = _mm_loadu_ps(l.mn + 4);
    __m128  mx0 = _mm_loadu_ps(l.mx), mx1 = _mm_loadu_ps(l.mx + 4);
    __m128d a[4], b[4];
    for (int q = 0; q < 4; q++) {
        a[q] = _mm_loadu_pd(l.s1 + 2 * q);
        b[q] = _mm_loadu_pd(l.s2 + 2 * q);
    }
    for (int64_t i = 0; i < n8; i += 8) {
        const __m128  v0   = _mm_loadu_ps(y + i);
        const __m128  v1   = _mm_loadu_ps(y + i + 4);
        const __m128d d[4] = { _mm_cvtps_pd(v0), _mm_cvtps_pd(_mm_movehl_ps(v0, v0)), _mm_cvtps_pd(v1),
                               _mm_cvtps_pd(_mm_movehl_ps(v1, v1)) };
        mn0                = _mm_min_ps(v0, mn0);
        mn1                = _mm_min_ps(v1, mn1);
        mx0                = _mm_max_ps(v0, mx0);
        mx1                = _mm_max_ps(v1, mx1);
        for (int q = 0; q < 4; q++) {
            a[q] = _mm_add_pd(a[q], d[q]);
            b[q] = _mm_add_pd(b[q], _mm_mul_pd(d[q], d[q]));
        }
    }
    _mm_storeu_ps(l.mn, mn0);
    _mm_storeu_ps(l.mn + 4, mn1);
    _mm_storeu_ps(l.mx, mx0);
    _mm_storeu_ps(l.mx + 4, mx1);
    for (int q = 0; q < 4; q++) {
        _mm_storeu_pd(l.s1 + 2 * q, a[q]);
        _mm_storeu_pd(l.s2 + 2 * q, b[q]);
    }
}
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    define LLAMA_INSTR_STATS_AVX 1

__attribute__((target("avx"))) static void lanes_avx(block_lanes & l, const float * y, int64_t n8) {
    __m256  mn = _mm256_loadu_ps(l.mn), mx = _mm256_loadu_ps(l.mx);
    __m256d a0 = _mm256_loadu_pd(l.s1), a1 = _mm256_loadu_pd(l.s1 + 4);
    __m256d b0 = _mm256_loadu_pd(l.s2), b1 = _mm256_loadu_pd(l.s2 + 4);
    for (int64_t i = 0; i < n8; i += 8) {
        const __m256  v  = _mm256_loadu_ps(y + i);
        const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        mn               = _mm256_min_ps(v, mn);
        mx               = _mm256_max_ps(v, mx);
        a0               = _mm256_add_pd(a0, d0);
        a1               = _mm256_add_pd(a1, d1);
        b0               = _mm256_add_pd(b0, _mm256_mul_pd(d0, d0));
        b1               = _mm256_add_pd(b1, _mm256_mul_pd(d1, d1));
    }
    _mm256_storeu_ps(l.mn, mn);
    _mm256_storeu_ps(l.mx, mx);
    _mm256_storeu_pd(l.s1, a0);
    _mm256_storeu_pd(l.s1 + 4, a1);
    _mm256_storeu_pd(l.s2, b0);
    _mm256_storeu_pd(l.s2 + 4, b1);
}
#endif

using lanes_fn = void (*)(block_lanes &, const float *, int64_t);

// the widest of the lanes this CPU runs, chosen once
static lanes_fn pick_lanes() {
#ifdef LLAMA_INSTR_STATS_AVX
    if (__builtin_cpu_supports("avx")) {
        return lanes_avx;
    }
#endif
#if defined(__SSE2__) || defined(_M_X64)
    return lanes_sse2;
#else
    return lanes_scalar;
#endif
}

// Float min/max and double sums over one contiguous run, in blocks: eight independent lanes with
// no test per value, summed in a fixed order (no -ffast-math). A NaN or an infinity makes the
// block's sum of squares non-finite (the squares of finite floats cannot overflow a double), and
// that block (rare) is redone one value at a time.
static void accumulate(stat_partial & a, const float * x, int64_t len) {
    constexpr int         L     = 8;
    constexpr int64_t     B     = 512;
    static const lanes_fn lanes = pick_lanes();
    for (int64_t b0 = 0; b0 < len; b0 += B) {
        const float * y = x + b0;
        const int64_t m = std::min(B, len - b0);
        block_lanes   l;
        for (int k = 0; k < L; k++) {
            l.mn[k] = INFINITY;
            l.mx[k] = -INFINITY;
            l.s1[k] = 0.0;
            l.s2[k] = 0.0;
        }
        const int64_t n8 = m - m % L;
        lanes(l, y, n8);
        for (int64_t i = n8; i < m; i++) {
            const float v = y[i];
            l.mn[0]       = v < l.mn[0] ? v : l.mn[0];
            l.mx[0]       = v > l.mx[0] ? v : l.mx[0];
            l.s1[0] += v;
            l.s2[0] += (double) v * v;
        }
        float  bmn = INFINITY, bmx = -INFINITY;
        double t1 = 0.0, t2 = 0.0;
        for (int k = 0; k < L; k++) {
            bmn = std::min(bmn, l.mn[k]);
            bmx = std::max(bmx, l.mx[k]);
            t1 += l.s1[k];
            t2 += l.s2[k];
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

void on_node(void * user, int32_t k, const ggml_tensor * t, int ith, int nth) {
    auto & u = *(on_node_user *) user;
    if (u.stats) {
        stats_on_node(*u.stats, k, t, ith, nth);
    }
    if (u.capture && !u.capture->slots.empty()) {
        capture_on_node(*u.capture, t, ith, nth);
    }
    if (u.experts) {
        experts_on_node(*u.experts, t, ith);
    }
}

bool capture_buffer::matches(const char * name) const {
    for (const auto & p : patterns) {
        if (!p.empty() && p.back() == '*' ? strncmp(name, p.data(), p.size() - 1) == 0 : p == name) {
            return true;
        }
    }
    return false;
}

capture_buffer::slot * capture_buffer::find(const ggml_tensor * t) {
    for (auto & s : slots) {
        if (s.node == t) {
            return &s;
        }
    }
    return nullptr;
}

// each thread converts its share of the output's rows into the slot (sized at compute begin)
void capture_on_node(capture_buffer & cb, const ggml_tensor * t, int ith, int nth) {
    capture_buffer::slot * s = cb.find(t);
    if (!s || !t->data || (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16)) {
        return;
    }
    const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    const int64_t r0   = rows * ith / nth;
    const int64_t r1   = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1  = r % t->ne[1];
        const int64_t i2  = (r / t->ne[1]) % t->ne[2];
        const int64_t i3  = r / (t->ne[1] * t->ne[2]);
        const char *  row = (const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        float *       dst = s->data.data() + r * t->ne[0];
        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
            const char * q = row + i0 * t->nb[0];
            dst[i0] = t->type == GGML_TYPE_F32 ? *(const float *) q : ggml_fp16_to_fp32(*(const ggml_fp16_t *) q);
        }
    }
    if (ith == 0) {
        s->filled = true;
    }
}

void stats_on_node(stats_buffer & sb, int32_t k, const ggml_tensor * t, int ith, int nth) {
    // a KV cache write returns a view of the whole cache: its "output" is the cache, not this op's
    if ((t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) || !t->data || is_kv_write(t)) {
        return;
    }
    const int workers = std::min(nth, sb.max_threads);
    if (ith >= workers || (size_t) (k + 1) * sb.max_threads > sb.partials.size()) {
        return;
    }
    stat_partial & a = sb.partials[(size_t) k * sb.max_threads + ith];
    a                = { INFINITY, -INFINITY, 0.0, 0.0, 0, 0, 0, sb.gen };

    // contiguous: an even share of the values (a generation step's outputs are single rows)
    if (ggml_is_contiguous(t)) {
        const int64_t n  = ggml_nelements(t);
        const int64_t e0 = n * ith / workers;
        const int64_t e1 = n * (ith + 1) / workers;
        if (t->type == GGML_TYPE_F32) {
            accumulate(a, (const float *) t->data + e0, e1 - e0);
            return;
        }
        float buf[256];  // F16: converted in blocks on the stack (nothing allocated here)
        for (int64_t e = e0; e < e1; e += 256) {
            const int64_t m = std::min<int64_t>(256, e1 - e);
            for (int64_t i = 0; i < m; i++) {
                buf[i] = ggml_fp16_to_fp32(((const ggml_fp16_t *) t->data)[e + i]);
            }
            accumulate(a, buf, m);
        }
        return;
    }

    // otherwise this thread's rows: an even share of ne1*ne2*ne3
    const int64_t rows     = t->ne[1] * t->ne[2] * t->ne[3];
    const int64_t r0       = rows * ith / workers;
    const int64_t r1       = rows * (ith + 1) / workers;
    const bool    f32_rows = t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float);
    float         buf[256];
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1  = r % t->ne[1];
        const int64_t i2  = (r / t->ne[1]) % t->ne[2];
        const int64_t i3  = r / (t->ne[1] * t->ne[2]);
        const char *  row = (const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        if (f32_rows) {
            accumulate(a, (const float *) row, t->ne[0]);
            continue;
        }
        // F16, or strided F32: convert in blocks on the stack (nothing allocated here)
        for (int64_t i0 = 0; i0 < t->ne[0]; i0 += 256) {
            const int64_t m = std::min<int64_t>(256, t->ne[0] - i0);
            for (int64_t i = 0; i < m; i++) {
                const char * q = row + (i0 + i) * t->nb[0];
                buf[i] = t->type == GGML_TYPE_F32 ? *(const float *) q : ggml_fp16_to_fp32(*(const ggml_fp16_t *) q);
            }
            accumulate(a, buf, m);
        }
    }
}

bool stats_buffer::merge(int32_t k, stat_row & out) const {
    if (max_threads <= 0 || (size_t) (k + 1) * max_threads > partials.size()) {
        return false;
    }
    float   mn = INFINITY, mx = -INFINITY;
    double  sum = 0.0, sum2 = 0.0;
    int64_t n = 0, n_nan = 0, n_inf = 0;
    bool    any = false;
    for (int32_t t = 0; t < max_threads; t++) {
        const stat_partial & p = partials[(size_t) k * max_threads + t];
        if (p.gen != gen) {
            continue;
        }
        any = true;
        mn  = std::min(mn, p.mn);
        mx  = std::max(mx, p.mx);
        sum += p.sum;
        sum2 += p.sum2;
        n += p.n;
        n_nan += p.n_nan;
        n_inf += p.n_inf;
    }
    if (!any) {
        return false;
    }
    out.n_nan = n_nan;
    out.n_inf = n_inf;
    if (n > 0) {
        out.min  = mn;
        out.max  = mx;
        out.mean = sum / n;
        out.std  = std::sqrt(std::max(0.0, sum2 / n - out.mean * out.mean));
    } else {
        out.min = out.max = out.mean = out.std = NAN;
    }
    return true;
}

}  // namespace llama_instr
