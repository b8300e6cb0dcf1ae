// llamacpp-instr: the machine's identity and its measured peaks.
//
// The peaks are measured with the very code paths a run takes: a ggml graph computed by the
// device's backend (for the CPU, with the run's thread count and, for a matmul, the extra buffer
// type that repacks weights where llama.cpp would use it), not a separate benchmark.

#include "llama-instr-peaks.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "llama-instr-model.h"
#include "llama-instr.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace llama_instr {

namespace {

// elements per row of the bandwidth probe's buffers (16 KiB of F32)
constexpr int64_t k_bw_row = 4096;

// F32 elements between two of the bandwidth probe's buffers (1088 bytes). The three buffers share
// one backend buffer; back to back, 256 MiB each, element i of all three would have the same
// address in every bit below 28, and ggml's ADD reached about 0.6x of a C triad on three separate
// allocations (which share the low 12 bits but not the bits above); with this gap about 0.9x at
// one thread (docs/performance.md has the measurements and the likely cause).
constexpr int64_t k_bw_gap = 272;

// the CPU model as the CPU backend reads it (/proc/cpuinfo, sysctl or the registry)
std::string cpu_model() {
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            const char * d = ggml_backend_dev_description(dev);
            return d ? d : "";
        }
    }
    return "";
}

void copy_str(char * dst, size_t size, const char * src) {
    snprintf(dst, size, "%s", src ? src : "");
}

int32_t fail(struct llama_instr_probe * p, int32_t code, const std::string & why) {
    copy_str(p->error, sizeof(p->error), why.c_str());
    return code;
}

// owns what one probe allocates, freed on every path
struct probe_res {
    std::vector<ggml_context *>        ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    ggml_backend_t                     backend = nullptr;

    // a context of n_tensors' metadata and a graph of up to graph_size nodes
    ggml_context * context(size_t n_tensors, size_t graph_size = GGML_DEFAULT_GRAPH_SIZE) {
        ggml_init_params ip = { n_tensors * ggml_tensor_overhead() + ggml_graph_overhead_custom(graph_size, false),
                                nullptr, true };
        ggml_context *   c  = ggml_init(ip);
        if (c) {
            ctxs.push_back(c);
        }
        return c;
    }

    ~probe_res() {
        for (auto * b : bufs) {
            ggml_backend_buffer_free(b);
        }
        for (auto * c : ctxs) {
            ggml_free(c);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
    }
};

// Values in [-1, 1) for a tensor of any type: quantized types are quantized from them, as a
// model's weights were, so every kernel sees well-formed blocks. The first rows (at least
// k_fill_values values) are drawn and quantized, and their bytes repeat over the rest: a probe's
// time does not depend on the values, and drawing and quantizing each of a weight far beyond
// the caches, or of a gigabyte of KV caches, would take seconds.
constexpr int64_t k_fill_values = 65536;

bool fill(ggml_tensor * t, std::mt19937 & rng) {
    const int64_t                         row   = t->ne[0];
    const int64_t                         nrows = ggml_nelements(t) / row;
    const int64_t                         tile  = std::min(nrows, std::max<int64_t>(1, k_fill_values / row));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float>                    f((size_t) (tile * row));
    for (auto & v : f) {
        v = u(rng);
    }
    std::vector<uint8_t> bytes(ggml_nbytes(t));
    const size_t         step = ggml_row_size(t->type, row) * (size_t) tile;
    ggml_quantize_chunk(t->type, f.data(), bytes.data(), 0, tile, row, nullptr);
    for (size_t at = step; at < bytes.size(); at += step) {
        memcpy(bytes.data() + at, bytes.data(), std::min(step, bytes.size() - at));
    }
    ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
    return true;
}

// w into the first of the device's extra buffer types that takes the op (as llama.cpp places
// weights), else into the device's default buffer type
bool place_weight(probe_res & r, ggml_backend_dev_t dev, ggml_context * cw, ggml_tensor * op) {
    ggml_backend_reg_t reg   = ggml_backend_dev_backend_reg(dev);
    auto               extra = reg ? (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
                           reg, "ggml_backend_dev_get_extra_bufts") :
                                     nullptr;
    if (extra) {
        for (ggml_backend_buffer_type_t * b = extra(dev); b && *b; b++) {
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(cw, *b);
            if (!buf) {
                continue;
            }
            if (ggml_backend_dev_supports_op(dev, op)) {
                r.bufs.push_back(buf);
                return true;
            }
            ggml_backend_buffer_free(buf);
            for (ggml_tensor * t = ggml_get_first_tensor(cw); t; t = ggml_get_next_tensor(cw, t)) {
                t->buffer = nullptr;
                t->data   = nullptr;
            }
        }
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(cw, ggml_backend_dev_buffer_type(dev));
    if (!buf) {
        return false;
    }
    r.bufs.push_back(buf);
    return true;
}

// the device's backend, with the probe's thread count on the CPU (all hardware threads for <= 0)
bool start_backend(probe_res & r, ggml_backend_dev_t dev, struct llama_instr_probe * p) {
    r.backend = ggml_backend_dev_init(dev, nullptr);
    if (!r.backend) {
        return false;
    }
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        auto               set_n =
            reg ? (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") :
                                nullptr;
        int n_threads = p->n_threads > 0 ? p->n_threads : (int) std::thread::hardware_concurrency();
        p->n_threads  = std::max(1, n_threads);
        if (set_n) {
            set_n(r.backend, p->n_threads);
        }
    }
    return true;
}

// the CPU backend's thread count (a no-op on another device)
void set_threads(probe_res & r, int n) {
    ggml_backend_dev_t dev = ggml_backend_get_device(r.backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    auto               set_n =
        reg ? (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") :
                            nullptr;
    if (set_n && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        set_n(r.backend, n);
    }
}

// The median of n timed runs (of an even count, the two middle runs' mean); reorders t.
static int64_t median_of(int64_t * t, int n) {
    std::nth_element(t, t + n / 2, t + n);
    const int64_t hi = t[n / 2];
    if (n % 2 == 1) {
        return hi;
    }
    return (*std::max_element(t, t + n / 2) + hi) / 2;
}

// gf computed once untimed (caches, pages and thread pools warm up), then p->n_runs times timed;
// with p->n_threads_b, at each count in turn (the runs alternate: a shared machine's speed moves
// between two counts timed apart)
int32_t time_runs(probe_res & r, ggml_cgraph * gf, struct llama_instr_probe * p) {
    using clk     = std::chrono::steady_clock;
    const bool b  = p->n_threads_b > 0;
    p->best_ns    = INT64_MAX;
    p->total_ns   = 0;
    p->best_ns_b  = b ? INT64_MAX : 0;
    p->total_ns_b = 0;
    int64_t runs[2][1000];  // each count's timed runs (n_runs <= 1000)
    for (int run = 0; run <= p->n_runs; run++) {
        for (int at_b = 0; at_b <= (b ? 1 : 0); at_b++) {
            if (b) {
                set_threads(r, at_b ? p->n_threads_b : p->n_threads);
            }
            const auto t0 = clk::now();
            if (ggml_backend_graph_compute(r.backend, gf) != GGML_STATUS_SUCCESS) {
                return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("the graph failed on ") + p->device_name);
            }
            ggml_backend_synchronize(r.backend);
            const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
            if (run > 0) {
                int64_t & best = at_b ? p->best_ns_b : p->best_ns;
                best           = std::min(best, ns);
                (at_b ? p->total_ns_b : p->total_ns) += ns;
                runs[at_b][run - 1] = ns;
            }
        }
    }
    p->best_ns     = std::max<int64_t>(p->best_ns, 1);
    p->best_ns_b   = b ? std::max<int64_t>(p->best_ns_b, 1) : 0;
    p->median_ns   = std::max<int64_t>(median_of(runs[0], p->n_runs), 1);
    p->median_ns_b = b ? std::max<int64_t>(median_of(runs[1], p->n_runs), 1) : 0;
    return LLAMA_INSTR_OK;
}

// what a probe reports of a tensor it ran
void report(struct llama_instr_probe * p, int i, const ggml_tensor * t) {
    p->tensors[i].type = t->type;
    for (int d = 0; d < 4; d++) {
        p->tensors[i].ne[d] = t->ne[d];
    }
    p->tensors[i].nbytes = (int64_t) ggml_nbytes(t);
}

// the most bytes an attention probe's caches and scores may take in all, and a matmul probe's weights
constexpr int64_t k_attn_max_bytes = int64_t(4) << 30;
constexpr int64_t k_mm_max_bytes   = int64_t(4) << 30;
// the most weights a matmul probe runs in one graph
constexpr int32_t k_max_weights    = 4096;

// Why a probe cannot hold a tensor of type t ("" when it can). fill() makes every tensor's values
// with ggml_quantize_chunk, which aborts the process on a type it quantizes only with an
// importance matrix (ggml_quantize_requires_imatrix: IQ2_XXS, IQ2_XS, IQ1_S) and on one it
// cannot make from F32 values at all (a type without to_float: I8, I16, I32, I64, F64, and
// Q8_1 and Q8_K, which only ever hold a matmul's activations): such a type is refused before
// anything is made of it.
std::string type_error(int32_t t) {
    if (t < 0 || t >= GGML_TYPE_COUNT || ggml_get_type_traits((ggml_type) t)->blck_size == 0) {
        return "unknown ggml type " + std::to_string(t);
    }
    const ggml_type type = (ggml_type) t;
    const char *    name = ggml_type_name(type);
    if (ggml_quantize_requires_imatrix(type)) {
        return std::string(name) +
               ": ggml quantizes it only with an importance matrix (imatrix), which a probe has not";
    }
    if (type != GGML_TYPE_F32 && ggml_get_type_traits(type)->to_float == nullptr) {
        return std::string(name) + ": ggml cannot make it from F32 values";
    }
    return "";
}

std::string attn_shape_error(const llama_instr_probe_attn & a, int64_t n) {
    if (a.op < LLAMA_INSTR_PROBE_ATTN_FLASH || a.op > LLAMA_INSTR_PROBE_ATTN_KQV) {
        return "attn.op must be 0 (flash), 1 (kq), 2 (softmax) or 3 (kqv)";
    }
    for (const int32_t t : { a.type_k, a.type_v }) {
        const std::string error = type_error(t);
        if (!error.empty()) {
            return "a cache's type: " + error;
        }
    }
    if (a.head_dim_k < 1 || a.head_dim_k > 1024 || a.head_dim_v < 1 || a.head_dim_v > 1024 || a.n_head_kv < 1 ||
        a.n_head_kv > 1024 || a.n_head < a.n_head_kv || a.n_head > 4096 || a.n_head % a.n_head_kv != 0) {
        return "head sizes 1..1024, KV heads 1..1024, query heads a multiple of them up to 4096";
    }
    if ((a.head_dim_k * a.n_head_kv) % ggml_blck_size((ggml_type) a.type_k) != 0 ||
        (a.head_dim_v * a.n_head_kv) % ggml_blck_size((ggml_type) a.type_v) != 0) {
        return "a cache's row is not a whole number of its type's blocks";
    }
    if (a.op == LLAMA_INSTR_PROBE_ATTN_KQV && ggml_blck_size((ggml_type) a.type_v) != 1) {
        return "a transposed V cache (kqv) must be of a type of single values (F16, F32, BF16)";
    }
    if (a.n_layer < 1 || a.n_layer > 512 || a.kv_size < 1 || a.kv_size > (1 << 22) || a.n_kv < 1 ||
        a.n_kv > a.kv_size || n < 1 || n > (1 << 16) || a.pos0 < 0 || a.pos0 + n > a.n_kv) {
        return "layers 1..512, kv_size 1..2^22, n_kv 1..kv_size, rows 1..65536, pos0 >= 0, pos0 + rows <= n_kv";
    }
    const int64_t cache = (int64_t) ggml_row_size((ggml_type) a.type_k, (int64_t) a.head_dim_k * a.n_head_kv) +
                          (int64_t) ggml_row_size((ggml_type) a.type_v, (int64_t) a.head_dim_v * a.n_head_kv);
    const int64_t scores = a.n_kv * n * a.n_head * (int64_t) sizeof(float);
    if (cache > k_attn_max_bytes / a.kv_size / a.n_layer || scores > k_attn_max_bytes / 2) {
        return "the caches and scores would take more than 4 GiB";
    }
    return "";
}

// attention's tensors: its sources (the mask, the query as rope leaves it, the scores) and each
// layer's cache (or two) and output
struct attn_graph {
    ggml_tensor *              mask   = nullptr;
    ggml_tensor *              q_in   = nullptr;
    ggml_tensor *              scores = nullptr;
    std::vector<ggml_tensor *> caches, outs;
};

// The op once per layer, as build_attn_mha builds it, on caches laid out as llama_kv_cache's
// (get_k, get_v): the sources in cs, the views and ops in cg.
void build_attention(const llama_instr_probe_attn & a,
                     int64_t                        n,
                     ggml_context *                 cs,
                     ggml_context *                 cg,
                     attn_graph &                   g) {
    const int64_t   hk = a.head_dim_k, hv = a.head_dim_v;
    const ggml_type tk = (ggml_type) a.type_k, tv = (ggml_type) a.type_v;
    const bool      flash = a.op == LLAMA_INSTR_PROBE_ATTN_FLASH;
    const float     scale = 1.0f / sqrtf((float) hk);

    g.mask          = ggml_new_tensor_2d(cs, flash ? GGML_TYPE_F16 : GGML_TYPE_F32, a.n_kv, n);
    g.q_in          = ggml_new_tensor_3d(cs, GGML_TYPE_F32, hk, a.n_head, n);  // Qcur after rope
    g.scores        = ggml_new_tensor_3d(cs, GGML_TYPE_F32, a.n_kv, n, a.n_head);
    ggml_tensor * q = ggml_permute(cg, g.q_in, 0, 2, 1, 3);
    for (int32_t il = 0; il < a.n_layer; il++) {
        ggml_tensor * out = nullptr;
        if (a.op == LLAMA_INSTR_PROBE_ATTN_SOFTMAX) {
            out = ggml_soft_max_ext(cg, g.scores, g.mask, scale, 0.0f);
        } else if (a.op == LLAMA_INSTR_PROBE_ATTN_KQV) {
            // the transposed V cache: each dimension of each head a row of kv_size cells
            ggml_tensor * cv = ggml_new_tensor_2d(cs, tv, hv * a.n_head_kv, a.kv_size);
            ggml_tensor * v  = ggml_view_3d(cg, cv, a.n_kv, a.n_head_kv, hv, ggml_row_size(tv, a.kv_size * hv),
                                            ggml_row_size(tv, a.kv_size), 0);
            g.caches.push_back(cv);
            out = ggml_mul_mat(cg, ggml_permute(cg, v, 0, 2, 1, 3), g.scores);
        } else {
            ggml_tensor * ck = ggml_new_tensor_2d(cs, tk, hk * a.n_head_kv, a.kv_size);
            ggml_tensor * k  = ggml_view_3d(cg, ck, hk, a.n_head_kv, a.n_kv, ggml_row_size(tk, hk),
                                            ggml_row_size(tk, hk * a.n_head_kv), 0);
            k                = ggml_permute(cg, k, 0, 2, 1, 3);
            g.caches.push_back(ck);
            if (flash) {
                ggml_tensor * cv = ggml_new_tensor_2d(cs, tv, hv * a.n_head_kv, a.kv_size);
                ggml_tensor * v  = ggml_view_3d(cg, cv, hv, a.n_head_kv, a.n_kv, ggml_row_size(tv, hv),
                                                ggml_row_size(tv, hv * a.n_head_kv), 0);
                g.caches.push_back(cv);
                out = ggml_flash_attn_ext(cg, q, k, ggml_permute(cg, v, 0, 2, 1, 3), g.mask, scale, 0.0f, 0.0f);
            } else {
                out = ggml_mul_mat(cg, k, q);
            }
            ggml_prec_set_acc(out, GGML_PREC_F32);
        }
        g.outs.push_back(out);
    }
}

// The sources in a buffer of the device (*src_buf), the layers' outputs in one buffer they share,
// and the op one the device runs: LLAMA_INSTR_OK, else the probe's failure.
int32_t place_attention(probe_res &                r,
                        ggml_backend_dev_t         dev,
                        ggml_context *             cs,
                        ggml_context *             cg,
                        const attn_graph &         g,
                        struct llama_instr_probe * p,
                        ggml_backend_buffer_t &    src_buf) {
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    copy_str(p->buffer_type, sizeof(p->buffer_type), ggml_backend_buft_name(buft));
    src_buf = ggml_backend_alloc_ctx_tensors_from_buft(cs, buft);
    ggml_backend_buffer_t out_buf =
        src_buf ? ggml_backend_buft_alloc_buffer(buft, ggml_nbytes(g.outs[0]) + ggml_backend_buft_get_alignment(buft)) :
                  nullptr;
    if (src_buf) {
        r.bufs.push_back(src_buf);
    }
    if (!out_buf) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot allocate the caches on ") + p->device_name);
    }
    r.bufs.push_back(out_buf);
    for (ggml_tensor * t = ggml_get_first_tensor(cg); t; t = ggml_get_next_tensor(cg, t)) {
        const ggml_status st = t->view_src ?
                                   ggml_backend_view_init(t) :
                                   ggml_backend_tensor_alloc(out_buf, t, ggml_backend_buffer_get_base(out_buf));
        if (st != GGML_STATUS_SUCCESS) {
            return fail(p, LLAMA_INSTR_ERR_INTERNAL, "cannot place the probe's tensors");
        }
    }
    if (!ggml_backend_dev_supports_op(dev, g.outs[0])) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL,
                    std::string(p->device_name) + " does not run " + ggml_op_desc(g.outs[0]));
    }
    return LLAMA_INSTR_OK;
}

// The sources' values: random, and the causal mask (row i sees the cells up to its position,
// pos0 + i).
void fill_attention(const llama_instr_probe_attn & a, int64_t n, const attn_graph & g) {
    std::mt19937 rng(1234);
    fill(g.q_in, rng);
    fill(g.scores, rng);
    for (ggml_tensor * c : g.caches) {
        fill(c, rng);
    }
    std::vector<float> m((size_t) (a.n_kv * n));
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < a.n_kv; j++) {
            m[(size_t) (i * a.n_kv + j)] = j <= a.pos0 + i ? 0.0f : -INFINITY;
        }
    }
    if (a.op == LLAMA_INSTR_PROBE_ATTN_FLASH) {
        std::vector<ggml_fp16_t> h(m.size());
        ggml_fp32_to_fp16_row(m.data(), h.data(), (int64_t) m.size());
        ggml_backend_tensor_set(g.mask, h.data(), 0, ggml_nbytes(g.mask));
    } else {
        ggml_backend_tensor_set(g.mask, m.data(), 0, ggml_nbytes(g.mask));
    }
}

// One of attention's ops as build_attn_mha builds it, on caches laid out as llama_kv_cache's
// (get_k, get_v), once per layer in one graph: each layer reads a cache of its own, as a model's
// layers do, so that the caches are as cold as the run's. The layers' outputs share one buffer
// (the run's graph allocator reuses its memory too), the scores one input.
int32_t attention(struct llama_instr_probe * p, ggml_backend_dev_t dev) {
    const llama_instr_probe_attn & a     = p->attn;
    const std::string              error = attn_shape_error(a, p->n);
    if (!error.empty()) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, error);
    }
    const int64_t n = p->n, hk = a.head_dim_k, hv = a.head_dim_v;

    probe_res      r;
    ggml_context * cs      = r.context(2 * (size_t) a.n_layer + 3);  // the sources
    const size_t   n_nodes = 8 * (size_t) a.n_layer + 8;             // views and ops: 6 a layer at most
    ggml_context * cg      = r.context(n_nodes, n_nodes);            // views, ops and the graph
    if (!cs || !cg) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, "out of memory");
    }
    attn_graph g;
    build_attention(a, n, cs, cg, g);
    ggml_backend_buffer_t src_buf = nullptr;
    const int32_t         placed  = place_attention(r, dev, cs, cg, g, p, src_buf);
    if (placed != LLAMA_INSTR_OK) {
        return placed;
    }
    if (!start_backend(r, dev, p)) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot start the backend of ") + p->device_name);
    }
    fill_attention(a, n, g);

    ggml_cgraph * gf = ggml_new_graph_custom(cg, n_nodes, false);
    for (ggml_tensor * out : g.outs) {
        ggml_build_forward_expand(gf, out);
    }

    // the op's query or scores, its first layer's cache (the mask for a softmax), its output
    report(p, 0, a.op == LLAMA_INSTR_PROBE_ATTN_SOFTMAX || a.op == LLAMA_INSTR_PROBE_ATTN_KQV ? g.scores : g.q_in);
    report(p, 1, g.caches.empty() ? g.mask : g.caches[0]);
    report(p, 2, g.outs[0]);
    p->n_tensors = 3;
    p->bytes     = (int64_t) ggml_backend_buffer_get_size(src_buf) + (int64_t) ggml_nbytes(g.outs[0]) * a.n_layer;
    const int64_t cells = a.n_kv * n * a.n_head;  // (query row, cell) pairs of every head
    const int64_t per   = a.op == LLAMA_INSTR_PROBE_ATTN_FLASH   ? 2 * (hk + hv) :
                          a.op == LLAMA_INSTR_PROBE_ATTN_KQ      ? 2 * hk :
                          a.op == LLAMA_INSTR_PROBE_ATTN_SOFTMAX ? 1 :
                                                                   2 * hv;
    p->flops            = cells * per * a.n_layer;
    return time_runs(r, gf, p);
}

// The fields every probe is checked for: its kind, device, runs and threads. LLAMA_INSTR_OK, else
// the probe's failure.
int32_t check_probe(struct llama_instr_probe * p) {
    if (p->kind != LLAMA_INSTR_PROBE_BANDWIDTH && p->kind != LLAMA_INSTR_PROBE_MATMUL &&
        p->kind != LLAMA_INSTR_PROBE_ATTENTION) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "kind must be 0 (bandwidth), 1 (matmul) or 2 (attention)");
    }
    if (p->device < 0 || (size_t) p->device >= ggml_backend_dev_count()) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                    "no backend device " + std::to_string(p->device) + " (the build has " +
                        std::to_string(ggml_backend_dev_count()) + ")");
    }
    if (p->n_runs < 1 || p->n_runs > 1000) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "n_runs must be 1..1000");
    }
    if (p->n_threads_b < 0 || (p->n_threads_b > 0 && p->kind != LLAMA_INSTR_PROBE_MATMUL)) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "n_threads_b must be 0, or above 0 for a matmul");
    }
    return LLAMA_INSTR_OK;
}

// A matmul's sizes (its type's blocks, its weights' bytes) or a bandwidth probe's (whole rows).
// LLAMA_INSTR_OK, else the probe's failure.
int32_t check_sizes(struct llama_instr_probe * p, bool mm) {
    if (mm) {
        const std::string error = type_error(p->type);
        if (!error.empty()) {
            return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, error);
        }
        const int64_t blck = ggml_blck_size((ggml_type) p->type);
        if (p->size < blck || p->size % blck != 0 || p->size > (1 << 16) || p->n < 1 || p->n > (1 << 16) || p->m < 0 ||
            p->m > (1 << 16)) {
            return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                        "matmul size must be a multiple of the type's block (" + std::to_string(blck) +
                            ") up to 65536, m 0..65536, n 1..65536");
        }
        const int64_t m = p->m > 0 ? p->m : p->size;
        if (p->n_weights < 0 || p->n_weights > k_max_weights ||
            ggml_row_size((ggml_type) p->type, p->size) * (size_t) m * (size_t) std::max(p->n_weights, 1) >
                (size_t) k_mm_max_bytes) {
            return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                        "n_weights must be 0..4096 and the weights at most 4 GiB in all");
        }
    } else if (p->size < k_bw_row || p->size % k_bw_row != 0 || p->size > (int64_t(1) << 32)) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                    "bandwidth size must be a multiple of " + std::to_string(k_bw_row) + " up to 2^32 elements");
    }
    return LLAMA_INSTR_OK;
}

// a matmul's or a bandwidth probe's graph: its first weight (or first source), its input, its
// first output
struct flat_graph {
    ggml_tensor * s0  = nullptr;
    ggml_tensor * s1  = nullptr;
    ggml_tensor * out = nullptr;
    ggml_cgraph * gf  = nullptr;
};

// n_w matmuls of one input (their weights alone in cw), or one add of two sources (rows, not one
// long vector: the backend's threads share an op's rows; a gap after each source, allocated in this
// order, puts the three at different offsets modulo 4 KiB)
void build_flat(struct llama_instr_probe * p,
                bool                       mm,
                int32_t                    n_w,
                ggml_context *             cw,
                ggml_context *             ca,
                flat_graph &               g) {
    g.gf = ggml_new_graph_custom(ca, (size_t) n_w + 4, false);
    if (mm) {
        g.s1 = ggml_new_tensor_2d(ca, GGML_TYPE_F32, p->size, p->n);
        for (int32_t i = 0; i < n_w; i++) {
            ggml_tensor * w = ggml_new_tensor_2d(cw, (ggml_type) p->type, p->size, p->m > 0 ? p->m : p->size);
            ggml_tensor * y = ggml_mul_mat(ca, w, g.s1);
            ggml_build_forward_expand(g.gf, y);
            g.s0  = i == 0 ? w : g.s0;
            g.out = i == 0 ? y : g.out;
        }
    } else {
        g.s0 = ggml_new_tensor_2d(ca, GGML_TYPE_F32, k_bw_row, p->size / k_bw_row);
        ggml_new_tensor_1d(ca, GGML_TYPE_F32, k_bw_gap);
        g.s1 = ggml_new_tensor_2d(ca, GGML_TYPE_F32, k_bw_row, p->size / k_bw_row);
        ggml_new_tensor_1d(ca, GGML_TYPE_F32, k_bw_gap);
        g.out = ggml_add(ca, g.s0, g.s1);
        ggml_build_forward_expand(g.gf, g.out);
    }
}

// The weights where the device keeps them (an extra buffer type may take them), the rest in its
// own buffer type, and the op one the device runs: LLAMA_INSTR_OK, else the probe's failure.
int32_t place_flat(probe_res &                r,
                   ggml_backend_dev_t         dev,
                   bool                       mm,
                   ggml_context *             cw,
                   ggml_context *             ca,
                   const flat_graph &         g,
                   struct llama_instr_probe * p) {
    if (mm) {
        if (!place_weight(r, dev, cw, g.out)) {
            return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot allocate the weight on ") + p->device_name);
        }
        copy_str(p->buffer_type, sizeof(p->buffer_type), ggml_backend_buffer_name(g.s0->buffer));
    } else {
        copy_str(p->buffer_type, sizeof(p->buffer_type), ggml_backend_buft_name(ggml_backend_dev_buffer_type(dev)));
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ca, ggml_backend_dev_buffer_type(dev));
    if (!buf) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot allocate the buffers on ") + p->device_name);
    }
    r.bufs.push_back(buf);
    if (!ggml_backend_dev_supports_op(dev, g.out)) {
        return fail(
            p, LLAMA_INSTR_ERR_INTERNAL,
            std::string(p->device_name) + " does not run " + ggml_op_desc(g.out) + " of " + ggml_type_name(g.s0->type));
    }
    return LLAMA_INSTR_OK;
}

int32_t probe(struct llama_instr_probe * p) {
    p->error[0]           = '\0';
    const int32_t checked = check_probe(p);
    if (checked != LLAMA_INSTR_OK) {
        return checked;
    }
    if (p->kind == LLAMA_INSTR_PROBE_ATTENTION) {
        ggml_backend_dev_t dev = ggml_backend_dev_get((size_t) p->device);
        copy_str(p->device_name, sizeof(p->device_name), ggml_backend_dev_name(dev));
        return attention(p, dev);
    }
    const bool    mm    = p->kind == LLAMA_INSTR_PROBE_MATMUL;
    const int32_t sized = check_sizes(p, mm);
    if (sized != LLAMA_INSTR_OK) {
        return sized;
    }

    ggml_backend_dev_t dev = ggml_backend_dev_get((size_t) p->device);
    copy_str(p->device_name, sizeof(p->device_name), ggml_backend_dev_name(dev));

    const int32_t  n_w = mm ? std::max(p->n_weights, 1) : 1;
    probe_res      r;
    ggml_context * cw = r.context((size_t) n_w + 1);  // the weights alone: they may go to an extra buffer type
    ggml_context * ca = r.context((size_t) n_w + 6, (size_t) n_w + 4);  // the other tensors (and the gaps), the graph
    if (!cw || !ca) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, "out of memory");
    }
    flat_graph g;
    build_flat(p, mm, n_w, cw, ca, g);
    const int32_t placed = place_flat(r, dev, mm, cw, ca, g, p);
    if (placed != LLAMA_INSTR_OK) {
        return placed;
    }
    if (!start_backend(r, dev, p)) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot start the backend of ") + p->device_name);
    }

    std::mt19937 rng(1234);
    if (mm) {
        for (ggml_tensor * w = ggml_get_first_tensor(cw); w; w = ggml_get_next_tensor(cw, w)) {
            fill(w, rng);
        }
    } else {
        fill(g.s0, rng);
    }
    fill(g.s1, rng);

    const ggml_tensor * ts[3] = { g.s0, g.s1, g.out };
    p->n_tensors              = 3;
    p->bytes                  = 0;
    for (int i = 0; i < 3; i++) {
        report(p, i, ts[i]);
        p->bytes += p->tensors[i].nbytes * (i == 1 ? 1 : n_w);
    }
    p->flops = mm ? 2 * g.s0->ne[0] * g.out->ne[0] * g.out->ne[1] * n_w : ggml_nelements(g.out);

    return time_runs(r, g.gf, p);
}

}  // namespace

void write_machine_info(json_out & j) {
    j.key("machine");
    j.ch('{');
    j.key("cpu");
    j.str(cpu_model());
    j.key("n_cpus");
    j.i64((int64_t) std::thread::hardware_concurrency());
    write_devices(j);
    j.ch('}');
}

}  // namespace llama_instr

const char * llama_instr_machine_info(void) {
    thread_local std::string s;
    try {
        s.clear();
        llama_instr::json_out j{ s };
        j.ch('{');
        llama_instr::write_machine_info(j);
        j.ch('}');
        // the object inside "machine": drop the wrapper {"machine": ... }
        const std::string head = "{\"machine\":";
        s                      = s.substr(head.size(), s.size() - head.size() - 1);
    } catch (...) {
        s.clear();
    }
    return s.c_str();
}

int32_t llama_instr_probe_run(struct llama_instr_probe * p) {
    if (!p) {
        return LLAMA_INSTR_ERR_INVALID_ARG;
    }
    try {
        return llama_instr::probe(p);
    } catch (const std::exception & e) {
        snprintf(p->error, sizeof(p->error), "probe failed: %s", e.what());
    } catch (...) {
        snprintf(p->error, sizeof(p->error), "%s", "probe failed");
    }
    return LLAMA_INSTR_ERR_INTERNAL;
}
