#include "llama-instr-stats.h"

#include "llama-instr-graph.h"

#include <algorithm>
#include <cmath>

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

// Float min/max and double sums over one contiguous run, branch-light so that the compiler
// vectorizes the common all-finite case.
static void accumulate(stat_partial & a, const float * x, int64_t len) {
    float   lmn = a.mn, lmx = a.mx;
    double  lsum = 0.0, lsum2 = 0.0;
    int64_t bad = 0;
    for (int64_t i = 0; i < len; i++) {
        const float v = x[i];
        if (!std::isfinite(v)) {
            bad++;
            continue;
        }
        lmn = std::min(lmn, v);
        lmx = std::max(lmx, v);
        lsum += v;
        lsum2 += (double) v * v;
    }
    if (bad) {
        for (int64_t i = 0; i < len; i++) {
            if (std::isnan(x[i])) {
                a.n_nan++;
            } else if (std::isinf(x[i])) {
                a.n_inf++;
            }
        }
    }
    a.mn = lmn;
    a.mx = lmx;
    a.sum += lsum;
    a.sum2 += lsum2;
    a.n += len - bad;
}

void stats_on_node(void * user, int32_t k, const ggml_tensor * t, int ith, int nth) {
    auto & sb = *(stats_buffer *) user;
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

    // this thread's rows: an even share of ne1*ne2*ne3
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
