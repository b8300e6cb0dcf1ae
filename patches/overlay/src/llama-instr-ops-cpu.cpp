// llamacpp-instr: the CPU backend's op timer. Patch 0001 gives the CPU backend a profiler
// (ggml_cpu_profiler): thread 0 timestamps the barrier after every executed (possibly fused) op, on
// the host clock; at VERBOSE each worker also notes when its share finished, and with
// LLAMA_INSTR_VALUE_STATS=1 every thread computes value statistics of the op's output (and, at any
// level, llama_instr_capture's copies) while it is intact.

#include "ggml-cpu-instr.h"
#include "ggml-cpu.h"
#include "llama-context.h"
#include "llama-instr-env.h"
#include "llama-instr-ops.h"
#include "llama-instr-session.h"

#include <algorithm>

using namespace llama_instr;

namespace {

// threads a compute of ctx (nullptr: st's encoder) may use: the profiler keeps one slot per thread
int32_t max_threads_of(const ctx_state & st, const llama_context * ctx) {
    if (!ctx) {
        return std::clamp<int32_t>(st.encoder ? st.encoder->n_threads : 1, 1, 512);
    }
    const auto & cp = ctx->get_cparams();
    return std::clamp<int32_t>(std::max(cp.n_threads, cp.n_threads_batch), 1, 512);
}

class cpu_op_timer final : public op_timer {
  public:
    cpu_op_timer(ggml_backend_t backend, int32_t device, ggml_backend_cpu_set_profiler_t set_profiler) :
        op_timer(backend, device),
        set_profiler(set_profiler) {}

    bool arm(ctx_state & st, const llama_context * ctx, const ggml_cgraph * gf) override {
        prof             = {};
        // one entry per node is the most a compute can produce (buffers only ever grow)
        const size_t cap = (size_t) ggml_graph_n_nodes(const_cast<ggml_cgraph *>(gf)) + 16;
        if (ops.size() < cap) {
            ops.resize(cap);
        }
        prof.ops  = ops.data();
        prof.cap  = (int32_t) ops.size();
        node_user = {};
        if (st.level >= LLAMA_INSTR_LEVEL_VERBOSE) {
            const int32_t nt = max_threads_of(st, ctx);
            if (thread_end.size() < ops.size() * nt) {
                thread_end.resize(ops.size() * nt);
            }
            prof.thread_end  = thread_end.data();
            prof.max_threads = nt;
            if (env_device(st.epoch).value_stats) {
                stats.prepare(prof.cap, nt);
                node_user.stats = &stats;
            }
        }
        if (arm_capture(st)) {
            node_user.capture = &st.capture;
        }
        // routing (DETAILED): only the routers' ARGSORT nodes, unless every op is called anyway
        if (st.level >= LLAMA_INSTR_LEVEL_DETAILED &&
            st.experts.arm(ctx, st.n_tokens, st.level >= LLAMA_INSTR_LEVEL_VERBOSE)) {
            node_user.experts = &st.experts;
        }
        if (node_user.stats || node_user.capture || node_user.experts) {
            prof.on_node    = on_node;
            prof.user       = &node_user;
            prof.on_node_op = node_user.stats || node_user.capture ? GGML_OP_NONE : GGML_OP_ARGSORT;
        }
        set_profiler(backend, &prof);
        return true;
    }

    void disarm() noexcept override { set_profiler(backend, nullptr); }

    // the CPU backend has computed every op before the scheduler returns
    bool needs_sync() const override { return false; }

    int64_t collect(ctx_state & st, compute_rec & c) override {
        const ggml_cpu_profiler & p = prof;
        c.n_threads                 = std::min(p.n_threads, p.thread_end ? p.max_threads : p.n_threads);
        if (p.t_start > 0) {
            c.t_start = std::min(c.t_start, p.t_start);
            c.t_end   = std::max(c.t_end, p.t_end);
        }

        // a full buffer may have dropped ops (it has room for every node of the graph)
        int64_t      n_lost   = p.n_ops >= p.cap && p.cap > 0 ? 1 : 0;
        const size_t op_begin = st.p_ops.size();
        for (int32_t k = 0; k < p.n_ops; k++) {
            const ggml_cpu_profile_op & op  = p.ops[k];
            const int32_t               idx = nodes.find(st, k, op.node);
            if (idx < 0) {
                n_lost++;  // not a node of the graph indexed: its time can't be attributed
                continue;
            }
            op_rec r       = {};
            r.idx          = idx;
            r.layer        = st.graph.layer[idx];
            r.n_fused      = op.n_fused;
            r.device       = device;
            r.t_start      = op.t_start;
            r.t_end        = op.t_end;
            r.thread_begin = -1;
            if (p.thread_end) {
                r.thread_begin = (int64_t) st.p_threads.size();
                for (int32_t t = 0; t < c.n_threads; t++) {
                    st.p_threads.push_back(p.thread_end[(int64_t) k * p.max_threads + t]);
                }
            }
            st.p_ops.push_back(r);
            stat_row s;
            if (node_user.stats && stats.merge(k, s)) {
                s.node = idx + op.n_fused;  // a fused op's statistics are of its last node's output
                st.p_stats.push_back(s);
            }
        }
        append_layer_spans(st, op_begin, st.p_ops.size());
        collect_capture(st);
        if (node_user.experts) {
            st.experts.collect();
        }
        return n_lost;
    }

  private:
    // capture targets: this graph's nodes that match (their buffers keep their capacity); false if none
    static bool arm_capture(ctx_state & st) {
        size_t n_slots      = 0;
        st.capture.n_filled = 0;
        if (!st.capture.patterns.empty()) {
            for (int i = 0; i < st.graph.n_nodes; i++) {
                const ggml_tensor * t = st.graph.ptrs[i];
                if (!st.capture.matches(t->name)) {
                    continue;
                }
                if (st.capture.slots.size() <= n_slots) {
                    st.capture.slots.emplace_back();
                }
                auto & slot = st.capture.slots[n_slots++];
                slot.node   = t;
                slot.filled = false;
                slot.name   = t->name;
                std::copy(t->ne, t->ne + GGML_MAX_DIMS, slot.ne);
                slot.data.resize(ggml_nelements(t));
            }
        }
        st.capture.slots.resize(n_slots);
        return n_slots > 0;
    }

    // serve only the captures this compute wrote, in graph order
    static void collect_capture(ctx_state & st) {
        auto & slots = st.capture.slots;
        size_t n     = 0;
        for (size_t i = 0; i < slots.size(); i++) {
            if (slots[i].filled) {
                std::swap(slots[i], slots[n++]);
            }
        }
        st.capture.n_filled = n;
    }

    const ggml_backend_cpu_set_profiler_t set_profiler;
    ggml_cpu_profiler                     prof = {};
    std::vector<ggml_cpu_profile_op>      ops;
    std::vector<int64_t>                  thread_end;
    stats_buffer                          stats;
    on_node_user                          node_user;
    node_map                              nodes;
};

}  // namespace

std::unique_ptr<op_timer> llama_instr::make_cpu_op_timer(ggml_backend_t     backend,
                                                         ggml_backend_reg_t reg,
                                                         int32_t            device) {
    auto set_profiler =
        (ggml_backend_cpu_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_profiler");
    if (!set_profiler) {
        return nullptr;
    }
    return std::make_unique<cpu_op_timer>(backend, device, set_profiler);
}
