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

    ggml_context * context(size_t n_tensors) {
        ggml_init_params ip = { n_tensors * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
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
// model's weights were, so every kernel sees well-formed blocks.
bool fill(ggml_tensor * t, std::mt19937 & rng) {
    const int64_t                         n = ggml_nelements(t);
    std::vector<float>                    f((size_t) n);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto & v : f) {
        v = u(rng);
    }
    std::vector<uint8_t> bytes(ggml_nbytes(t));
    if (t->type == GGML_TYPE_F32) {
        memcpy(bytes.data(), f.data(), bytes.size());
    } else {
        const int64_t row = t->ne[0];
        ggml_quantize_chunk(t->type, f.data(), bytes.data(), 0, n / row, row, nullptr);
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

int32_t probe(struct llama_instr_probe * p) {
    p->error[0] = '\0';
    if (p->kind != LLAMA_INSTR_PROBE_BANDWIDTH && p->kind != LLAMA_INSTR_PROBE_MATMUL) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "kind must be 0 (bandwidth) or 1 (matmul)");
    }
    if (p->device < 0 || (size_t) p->device >= ggml_backend_dev_count()) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                    "no backend device " + std::to_string(p->device) + " (the build has " +
                        std::to_string(ggml_backend_dev_count()) + ")");
    }
    if (p->n_runs < 1 || p->n_runs > 1000) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "n_runs must be 1..1000");
    }
    const bool mm = p->kind == LLAMA_INSTR_PROBE_MATMUL;
    if (mm) {
        if (p->type < 0 || p->type >= GGML_TYPE_COUNT || ggml_get_type_traits((ggml_type) p->type)->blck_size == 0) {
            return fail(p, LLAMA_INSTR_ERR_INVALID_ARG, "unknown ggml type " + std::to_string(p->type));
        }
        const int64_t blck = ggml_blck_size((ggml_type) p->type);
        if (p->size < blck || p->size % blck != 0 || p->size > (1 << 16) || p->n < 1 || p->n > (1 << 16)) {
            return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                        "matmul size must be a multiple of the type's block (" + std::to_string(blck) +
                            ") up to 65536, n 1..65536");
        }
    } else if (p->size < k_bw_row || p->size % k_bw_row != 0 || p->size > (int64_t(1) << 32)) {
        return fail(p, LLAMA_INSTR_ERR_INVALID_ARG,
                    "bandwidth size must be a multiple of " + std::to_string(k_bw_row) + " up to 2^32 elements");
    }

    ggml_backend_dev_t dev = ggml_backend_dev_get((size_t) p->device);
    copy_str(p->device_name, sizeof(p->device_name), ggml_backend_dev_name(dev));

    probe_res      r;
    ggml_context * cw = r.context(2);  // w alone: it may go to an extra buffer type
    ggml_context * ca = r.context(6);  // the other tensors (and the gaps) and the graph
    if (!cw || !ca) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, "out of memory");
    }
    ggml_tensor * out = nullptr;
    ggml_tensor * s0  = nullptr;
    ggml_tensor * s1  = nullptr;
    if (mm) {
        s0  = ggml_new_tensor_2d(cw, (ggml_type) p->type, p->size, p->size);
        s1  = ggml_new_tensor_2d(ca, GGML_TYPE_F32, p->size, p->n);
        out = ggml_mul_mat(ca, s0, s1);
    } else {
        // rows, not one long vector: the backend's threads share an op's rows; a gap after each
        // source (allocated in this order) puts the three at different offsets modulo 4 KiB
        s0 = ggml_new_tensor_2d(ca, GGML_TYPE_F32, k_bw_row, p->size / k_bw_row);
        ggml_new_tensor_1d(ca, GGML_TYPE_F32, k_bw_gap);
        s1 = ggml_new_tensor_2d(ca, GGML_TYPE_F32, k_bw_row, p->size / k_bw_row);
        ggml_new_tensor_1d(ca, GGML_TYPE_F32, k_bw_gap);
        out = ggml_add(ca, s0, s1);
    }

    if (mm) {
        if (!place_weight(r, dev, cw, out)) {
            return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot allocate the weight on ") + p->device_name);
        }
        copy_str(p->buffer_type, sizeof(p->buffer_type), ggml_backend_buffer_name(s0->buffer));
    } else {
        copy_str(p->buffer_type, sizeof(p->buffer_type), ggml_backend_buft_name(ggml_backend_dev_buffer_type(dev)));
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ca, ggml_backend_dev_buffer_type(dev));
    if (!buf) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot allocate the buffers on ") + p->device_name);
    }
    r.bufs.push_back(buf);
    if (!ggml_backend_dev_supports_op(dev, out)) {
        return fail(
            p, LLAMA_INSTR_ERR_INTERNAL,
            std::string(p->device_name) + " does not run " + ggml_op_desc(out) + " of " + ggml_type_name(s0->type));
    }

    r.backend = ggml_backend_dev_init(dev, nullptr);
    if (!r.backend) {
        return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("cannot start the backend of ") + p->device_name);
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

    std::mt19937 rng(1234);
    fill(s0, rng);
    fill(s1, rng);

    ggml_cgraph * gf = ggml_new_graph_custom(ca, 4, false);
    ggml_build_forward_expand(gf, out);

    const ggml_tensor * ts[3] = { s0, s1, out };
    p->n_tensors              = 3;
    p->bytes                  = 0;
    for (int i = 0; i < 3; i++) {
        p->tensors[i].type = ts[i]->type;
        for (int d = 0; d < 4; d++) {
            p->tensors[i].ne[d] = ts[i]->ne[d];
        }
        p->tensors[i].nbytes = (int64_t) ggml_nbytes(ts[i]);
        p->bytes += p->tensors[i].nbytes;
    }
    p->flops = mm ? 2 * s0->ne[0] * out->ne[0] * out->ne[1] : ggml_nelements(out);

    using clk   = std::chrono::steady_clock;
    p->best_ns  = INT64_MAX;
    p->total_ns = 0;
    for (int run = 0; run <= p->n_runs; run++) {  // run 0 warms caches, pages and thread pools
        const auto t0 = clk::now();
        if (ggml_backend_graph_compute(r.backend, gf) != GGML_STATUS_SUCCESS) {
            return fail(p, LLAMA_INSTR_ERR_INTERNAL, std::string("the graph failed on ") + p->device_name);
        }
        ggml_backend_synchronize(r.backend);
        const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
        if (run > 0) {
            p->best_ns = std::min(p->best_ns, ns);
            p->total_ns += ns;
        }
    }
    p->best_ns = std::max<int64_t>(p->best_ns, 1);
    return LLAMA_INSTR_OK;
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
