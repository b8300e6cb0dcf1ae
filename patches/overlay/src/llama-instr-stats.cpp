#include "llama-instr-stats.h"

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

// Float min/max and double sums over one contiguous run. Eight independent lanes, so that the
// compiler vectorizes without reassociating a sum (no -ffast-math); a block holding a NaN or an
// infinity (rare) is redone one value at a time.
static void accumulate(stat_partial & a, const float * x, int64_t len) {
    constexpr int L = 8;
    float         mn[L], mx[L];
    double        s1[L], s2[L];
    for (int k = 0; k < L; k++) {
        mn[k] = INFINITY;
        mx[k] = -INFINITY;
        s1[k] = 0.0;
        s2[k] = 0.0;
    }
    int64_t n = 0, i = 0;
    auto    one = [&](float v) {
        if (std::isnan(v)) {
            a.n_nan++;
        } else if (std::isinf(v)) {
            a.n_inf++;
        } else {
            mn[0] = std::min(mn[0], v);
            mx[0] = std::max(mx[0], v);
            s1[0] += v;
            s2[0] += (double) v * v;
            n++;
        }
    };
    for (; i + L <= len; i += L) {
        float finite = 0.0f;  // v - v is 0 for a finite v, NaN otherwise
        for (int k = 0; k < L; k++) {
            finite += x[i + k] - x[i + k];
        }
        if (!(finite == 0.0f)) {
            for (int k = 0; k < L; k++) {
                one(x[i + k]);
            }
            continue;
        }
        for (int k = 0; k < L; k++) {
            const float v = x[i + k];
            mn[k]         = v < mn[k] ? v : mn[k];
            mx[k]         = v > mx[k] ? v : mx[k];
            s1[k] += v;
            s2[k] += (double) v * v;
        }
        n += L;
    }
    for (; i < len; i++) {
        one(x[i]);
    }
    for (int k = 0; k < L; k++) {
        a.mn = std::min(a.mn, mn[k]);
        a.mx = std::max(a.mx, mx[k]);
        a.sum += s1[k];
        a.sum2 += s2[k];
    }
    a.n += n;
}

void on_node(void * user, int32_t k, const ggml_tensor * t, int ith, int nth) {
    auto & u = *(on_node_user *) user;
    if (u.stats) {
        stats_on_node(*u.stats, k, t, ith, nth);
    }
    if (u.capture && !u.capture->slots.empty()) {
        capture_on_node(*u.capture, t, ith, nth);
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
