#include "llama-instr-stats.h"

#include "llama-instr-experts.h"
#include "llama-instr-graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// Float min/max and double sums over one contiguous run, in blocks: eight independent lanes with
// no test per value, so that the compiler vectorizes without reassociating a sum (no
// -ffast-math). A NaN or an infinity makes the block's sum of squares non-finite (the squares of
// finite floats cannot overflow a double), and that block (rare) is redone one value at a time.
static void accumulate(stat_partial & a, const float * x, int64_t len) {
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
