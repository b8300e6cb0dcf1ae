// llamacpp-instr: the Vulkan backend's op timer. Patch 0006 gives ggml-vulkan a profiler
// (ggml_vk_profiler): timestamp queries written into the command buffers the backend records
// anyway, when a buffer begins, before its first op, after ops and when it ends; read after the
// fence the backend already waits on. A timestamp waits for the commands recorded before it, so
// the time between two marks of a buffer is the work recorded between them: at DETAILED every op
// is marked, and each op's interval runs from the previous mark to its own; at MINIMAL only the
// last op of each layer is (and the last op of each command buffer), which gives the layer spans.
// Each command buffer's first to last mark is the device's busy time (`busy`). Device times are
// put on the host clock (CLOCK_MONOTONIC, now_ns()) by a clock pair: VK_EXT_calibrated_timestamps
// where the driver has it (at every collect), else a timestamp submitted alone between two host
// readings (`clocks` says which, and the uncertainty). At DETAILED a mixture of experts' router
// rankings are read back too (patch 0006's reads), each copy timed by a mark of its own: in no
// op, summed in the experts record's `read_dur`; with the device's ops untimed
// (LLAMA_INSTR_DEVICE_TIMING=0) only the copies and the marks they need are recorded.

#include "ggml-vulkan-instr.h"
#include "llama-instr-env.h"
#include "llama-instr-experts.h"
#include "llama-instr-ops.h"
#include "llama-instr-session.h"

#include <algorithm>

using namespace llama_instr;

namespace {

// a fenced clock pair is taken again when the last is older than this (ns), and its uncertainty
// grows by CLOCK_DRIFT of the time since it was taken: a bound on two crystals' relative drift
constexpr int64_t FENCE_PAIR_MAX_AGE = 100 * 1000 * 1000;
constexpr double  CLOCK_DRIFT        = 100e-6;

class vk_op_timer final : public op_timer {
  public:
    vk_op_timer(ggml_backend_t                     backend,
                int32_t                            device,
                ggml_backend_vk_set_profiler_t     set_profiler,
                ggml_backend_vk_profiler_collect_t collect_marks,
                ggml_backend_gpu_clock_pair_t      clock_pair) :
        op_timer(backend, device),
        set_profiler(set_profiler),
        collect_marks(collect_marks),
        clock_pair(clock_pair) {}

    bool arm(ctx_state & st, const llama_context * ctx, const ggml_cgraph * gf) override {
        GGML_UNUSED(ctx);
        // LLAMA_INSTR_DEVICE_TIMING=0: the device's ops untimed (the scheduler's splits and copies
        // are still recorded); LLAMA_INSTR_DEVICE_CLOCK=fence: the fenced pair even where the
        // driver calibrates (tests). Read once per session (llama-instr-env.h)
        // Untimed, a mixture of experts' routing is still read at DETAILED: the copies and their
        // own marks, and the marks every command buffer has, but no op's.
        const device_env env = env_device(st.epoch);
        timed                = env.timing;
        method               = env.clock_fence ? GGML_GPU_CLOCK_FENCE : GGML_GPU_CLOCK_ANY;
        // a mark per op, one per read and three per command buffer, a buffer with an op at least
        // (or none: copies): room for a buffer per op, and then some
        const size_t n       = (size_t) ggml_graph_n_nodes(const_cast<ggml_cgraph *>(gf));
        const size_t cap     = 5 * n + 64;
        if (marks.size() < cap) {
            marks.resize(cap);
        }
        prof       = {};
        prof.marks = marks.data();
        prof.cap   = (int32_t) marks.size();
        prof.user  = this;
        if (!timed) {
            prof.want = want_none;
        } else if (st.level < LLAMA_INSTR_LEVEL_DETAILED) {
            index_layer_ends(st);
            prof.want = want_layer_end;
            want_st   = &st;
            want_k    = 0;
        }
        arm_routing(st, ctx);
        if (!timed && !experts) {
            return false;
        }
        return set_profiler(backend, &prof) == 0;
    }

    void disarm() noexcept override { set_profiler(backend, nullptr); }

    int64_t collect(ctx_state & st, compute_rec & c) override {
        const int32_t n = std::min(prof.n_marks, prof.cap);
        if (n == 0) {
            return prof.n_lost;  // nothing ran on the device in this compute
        }
        if (collect_marks(backend, &prof, 0, n) != 0) {
            return n + prof.n_lost + prof.n_reads_lost;  // no device time read
        }
        collect_routing(st, n);
        if (!timed) {
            return prof.n_reads_lost;  // routing only
        }
        if (!calibrate()) {
            return n + prof.n_lost + prof.n_reads_lost;  // no device time on the host clock
        }
        st.p_clocks.push_back({ device, pair.method, uncertainty });

        mark_walk w;
        w.detailed            = st.level >= LLAMA_INSTR_LEVEL_DETAILED;
        w.n_lost              = prof.n_lost;
        const size_t op_begin = st.p_ops.size();
        pieces.clear();
        for (int32_t k = 0; k < n; k++) {
            walk_mark(st, c, marks[k], w);
        }
        if (w.detailed) {
            append_layer_spans(st, op_begin, st.p_ops.size());
        } else {
            append_piece_spans(st);
        }
        if (w.read) {
            c.expert_read_dur = std::max<int64_t>(c.expert_read_dur, 0) + w.read_dur;
        }
        return w.n_lost + prof.n_reads_lost;
    }

  private:
    // a walk over a compute's marks: the command buffer being walked (its first mark's time, its
    // split, its ops), the previous mark's time, the ops met so far, the reads' copies
    struct mark_walk {
        bool    detailed = false;
        bool    in_buf = false, have_prev = false;
        int64_t buf_start = 0, prev = 0;
        int32_t buf_split = -1, buf_ops = 0, k_op = 0;
        int64_t read_dur = 0;  // the reads' copies: their own intervals, in no op
        bool    read     = false;
        int64_t n_lost   = 0;
    };

    void walk_mark(ctx_state & st, compute_rec & c, const ggml_vk_profile_mark & m, mark_walk & w) {
        if (!m.valid) {
            // never executed (a buffer not submitted): the intervals around it are unknown
            w.n_lost += m.kind == GGML_VK_PROFILE_OP ? 1 : 0;
            w.have_prev = false;
            w.in_buf    = w.in_buf && m.kind != GGML_VK_PROFILE_CMDBUF_BEGIN && m.kind != GGML_VK_PROFILE_CMDBUF_END;
            return;
        }
        const int64_t t = to_host(m.t);
        switch (m.kind) {
            case GGML_VK_PROFILE_CMDBUF_BEGIN:
                w.in_buf    = true;
                w.buf_start = t;
                w.buf_split = -1;
                w.buf_ops   = 0;
                break;
            case GGML_VK_PROFILE_OPS_BEGIN:
                break;
            case GGML_VK_PROFILE_OP:
                walk_op(st, c, m, t, w);
                break;
            case GGML_VK_PROFILE_READ:
                if (w.have_prev) {
                    w.read_dur += t - w.prev;
                    w.read = true;
                }
                break;
            case GGML_VK_PROFILE_CMDBUF_END:
                walk_cmdbuf_end(st, c, m, t, w);
                break;
            default:
                break;
        }
        w.have_prev = w.in_buf;
        w.prev      = t;
    }

    // an op's mark ends its interval, from the previous mark: an op record (DETAILED) or a piece of
    // its layer's span
    void walk_op(ctx_state & st, compute_rec & c, const ggml_vk_profile_mark & m, int64_t t, mark_walk & w) {
        const int32_t idx = nodes.find(st, w.k_op++, m.node);
        w.buf_ops += m.n_ops;
        if (idx < 0) {
            w.n_lost++;  // not a node of the graph indexed: its time can't be attributed
        } else if (!w.have_prev) {
            w.n_lost++;
        } else if (w.detailed) {
            op_rec r       = {};
            r.idx          = idx;
            r.layer        = st.graph.layer[idx];
            r.n_fused      = m.n_fused;
            r.device       = device;
            r.t_start      = w.prev;
            r.t_end        = t;
            r.thread_begin = -1;
            st.p_ops.push_back(r);
        } else {
            pieces.push_back({ st.graph.layer[idx], m.n_ops, w.prev, t });
        }
        if (idx >= 0 && w.buf_split < 0) {
            w.buf_split = split_of(st, c, idx);
        }
    }

    // a command buffer's end: its busy time, from its first mark, and (MINIMAL) the ops after its
    // last mark
    void walk_cmdbuf_end(ctx_state & st, compute_rec & c, const ggml_vk_profile_mark & m, int64_t t, mark_walk & w) {
        if (w.buf_split < 0 && m.node) {
            // MINIMAL: a buffer whose ops are all unmarked (its last op is named here)
            const int32_t idx = st.graph.find(m.node);
            w.buf_split       = idx >= 0 ? split_of(st, c, idx) : -1;
        }
        if (w.in_buf) {
            st.p_busy.push_back({ device, w.buf_split, w.buf_ops + m.n_ops, w.buf_start, t });
            c.t_start = std::min(c.t_start, w.buf_start);
            c.t_end   = std::max(c.t_end, t);
        }
        if (!w.detailed && m.n_ops > 0 && w.have_prev) {
            // ops after the buffer's last mark: of the layer the next marked op ends
            pieces.push_back({ PIECE_NEXT_LAYER, m.n_ops, w.prev, t });
        }
        w.in_buf = false;
    }

    // DETAILED, a mixture of experts: each router's ranking on this device read back with the
    // commands it is computed in (the first n_used ids of each token), tallied after the graph
    void arm_routing(ctx_state & st, const llama_context * ctx) {
        experts = nullptr;
        if (st.level < LLAMA_INSTR_LEVEL_DETAILED ||
            !st.experts.arm(ctx, st.n_tokens, st.level >= LLAMA_INSTR_LEVEL_VERBOSE)) {
            return;
        }
        // each layer's ranking as a block of whole rows (n_expert ids each) but the last's tail
        const expert_log & log  = st.experts;
        const size_t       rows = (size_t) std::max<int32_t>(st.n_tokens, 1);
        const size_t       need = (size_t) log.n_layer * log.n_expert * sizeof(int32_t) * rows;
        if (readback.size() < need) {
            readback.resize(need);
        }
        if (reads.size() < (size_t) log.n_layer + 8) {
            reads.resize((size_t) log.n_layer + 8);
        }
        experts           = &st.experts;
        prof.read         = read_router;
        prof.reads        = reads.data();
        prof.reads_cap    = (int32_t) reads.size();
        prof.readback     = readback.data();
        prof.readback_cap = readback.size();
    }

    // which op's output to read: a router's ranking (its first n_used ids per token)
    static const ggml_tensor * read_router(void *                user,
                                           ggml_tensor * const * nodes,
                                           int32_t               n_nodes,
                                           size_t *              row_bytes) {
        const auto * self = (const vk_op_timer *) user;
        if (!self->experts) {
            return nullptr;
        }
        for (int32_t k = 0; k < n_nodes; k++) {
            const int32_t il = router_layer(*self->experts, nodes[k]);
            if (il >= 0) {
                *row_bytes = (size_t) self->experts->n_used[il] * sizeof(int32_t);
                return nodes[k];
            }
        }
        return nullptr;
    }

    // the reads that ran (their op's mark is valid) into the routing tallies
    void collect_routing(ctx_state & st, int32_t n_marks) {
        if (!experts) {
            return;
        }
        const int32_t n = std::min(prof.n_reads, prof.reads_cap);
        for (int32_t k = 0; k < n; k++) {
            const ggml_vk_profile_read & r = prof.reads[k];
            if (r.mark < 0 || r.mark >= n_marks || !marks[r.mark].valid) {
                continue;
            }
            const int32_t il = router_layer(st.experts, r.tensor);
            if (il >= 0 && r.row_bytes == (size_t) st.experts.n_used[il] * sizeof(int32_t) &&
                r.row_stride % sizeof(int32_t) == 0 && r.offset % sizeof(int32_t) == 0) {
                experts_on_ids(st.experts, il, (const int32_t *) (prof.readback + r.offset), r.n_rows,
                               r.row_stride / sizeof(int32_t));
            }
        }
        st.experts.collect();
    }

    static constexpr int32_t PIECE_NEXT_LAYER = -2;

    // ops that ran between two marks, all of one layer
    struct piece {
        int32_t layer;
        int32_t n_ops;
        int64_t t_start, t_end;
    };

    // untimed (reads only): no op is marked but those the backend always marks
    static bool want_none(void * user, const ggml_tensor * first, const ggml_tensor * last) {
        GGML_UNUSED(user);
        GGML_UNUSED(first);
        GGML_UNUSED(last);
        return false;
    }

    // MINIMAL: mark an op when its last node ends a layer (the next node that runs is of another)
    static bool want_layer_end(void * user, const ggml_tensor * first, const ggml_tensor * last) {
        GGML_UNUSED(first);
        auto *        self = (vk_op_timer *) user;
        const int32_t idx  = self->want_nodes.find(*self->want_st, self->want_k++, last);
        return idx < 0 || (size_t) idx >= self->layer_end.size() || self->layer_end[idx];
    }

    // which nodes of the graph indexed end a layer, in the order they run
    void index_layer_ends(ctx_state & st) {
        if (layer_end_gen == st.graph_gen && layer_end.size() == (size_t) st.graph.n_nodes) {
            return;
        }
        const graph_index & g = st.graph;
        layer_end.assign(g.n_nodes, 0);
        int32_t next = -1;  // the next computed node
        for (int32_t i = g.n_nodes - 1; i >= 0; i--) {
            const ggml_tensor * t = g.ptrs[i];
            if (is_noop(t)) {
                continue;
            }
            layer_end[i] = next < 0 || g.layer[next] != g.layer[i];
            next         = i;
        }
        layer_end_gen = st.graph_gen;
    }

    // the index in this compute's splits of the split holding node idx, or -1
    static int32_t split_of(const ctx_state & st, const compute_rec & c, int32_t idx) {
        for (size_t s = c.split_begin; s < c.split_end; s++) {
            if (st.p_splits[s].i_start <= idx && idx < st.p_splits[s].i_end) {
                return (int32_t) (s - c.split_begin);
            }
        }
        return -1;
    }

    // MINIMAL: the pieces, each of its layer (a trailing piece: of the next piece's), as layer spans
    void append_piece_spans(ctx_state & st) {
        int32_t next_layer = -1;
        for (size_t i = pieces.size(); i-- > 0;) {
            if (pieces[i].layer == PIECE_NEXT_LAYER) {
                pieces[i].layer = next_layer;
            }
            next_layer = pieces[i].layer;
        }
        layer_rec cur = {};
        cur.layer     = -1;
        for (const piece & p : pieces) {
            if (p.layer < 0) {
                continue;
            }
            if (p.layer != cur.layer) {
                if (cur.n_ops > 0) {
                    st.p_layers.push_back(cur);
                }
                cur         = {};
                cur.layer   = p.layer;
                cur.device  = device;
                cur.t_start = p.t_start;
            }
            cur.t_end = p.t_end;
            cur.n_ops += p.n_ops;
        }
        if (cur.n_ops > 0) {
            st.p_layers.push_back(cur);
        }
    }

    // a clock pair for this collect (the backend is idle); false if none could be taken
    bool calibrate() {
        const int64_t now = now_ns();
        if (have_pair && pair.method == GGML_GPU_CLOCK_FENCE && now - pair.host_ns < FENCE_PAIR_MAX_AGE) {
            uncertainty = pair.max_deviation_ns + (int64_t) (CLOCK_DRIFT * (double) (now - pair.host_ns));
            return true;
        }
        ggml_gpu_clock_pair p = {};
        // on CLOCK_MONOTONIC (now_ns's clock), where the driver's calibration is open to it
        if (clock_pair(backend, method, nullptr, &p) != 0) {
            return have_pair && calibrate_stale(now);
        }
        pair        = p;
        have_pair   = true;
        uncertainty = p.max_deviation_ns;
        return true;
    }

    // no new pair: the last one, with its drift bound
    bool calibrate_stale(int64_t now) {
        uncertainty = pair.max_deviation_ns + (int64_t) (CLOCK_DRIFT * (double) (now - pair.host_ns));
        return true;
    }

    // device ticks -> host ns, through the pair (ticks wrap at valid_bits)
    int64_t to_host(uint64_t ticks) const {
        const int      bits = std::clamp(prof.valid_bits, 1, 64);
        const uint64_t mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t       d    = (ticks - pair.device_time) & mask;
        int64_t        dt   = (int64_t) d;
        if (bits < 64 && (d >> (bits - 1)) != 0) {
            dt = (int64_t) d - (int64_t) (1ull << bits);  // before the pair
        }
        return pair.host_ns + (int64_t) ((double) dt * prof.period_ns);
    }

    const ggml_backend_vk_set_profiler_t     set_profiler;
    const ggml_backend_vk_profiler_collect_t collect_marks;
    const ggml_backend_gpu_clock_pair_t      clock_pair;
    int32_t                                  method = GGML_GPU_CLOCK_ANY;  // enum ggml_gpu_clock_method
    bool                                     timed  = true;  // LLAMA_INSTR_DEVICE_TIMING (else routing only)

    ggml_vk_profiler                  prof = {};
    std::vector<ggml_vk_profile_mark> marks;
    // routing (DETAILED): the reads and their bytes, and the tallies they go to (null: none)
    std::vector<ggml_vk_profile_read> reads;
    std::vector<uint8_t>              readback;
    expert_log *                      experts = nullptr;
    std::vector<piece>                pieces;
    node_map                          nodes;

    // MINIMAL: which nodes end a layer, by node index, for the graph of generation layer_end_gen
    std::vector<uint8_t> layer_end;
    uint64_t             layer_end_gen = ~0ull;
    ctx_state *          want_st       = nullptr;
    size_t               want_k        = 0;
    node_map             want_nodes;

    ggml_gpu_clock_pair pair        = {};
    bool                have_pair   = false;
    int64_t             uncertainty = 0;
};

}  // namespace

std::unique_ptr<op_timer> llama_instr::make_vk_op_timer(ggml_backend_t     backend,
                                                        ggml_backend_reg_t reg,
                                                        int32_t            device) {
    auto set_profiler =
        (ggml_backend_vk_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_vk_set_profiler");
    auto collect_marks =
        (ggml_backend_vk_profiler_collect_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_vk_profiler_collect");
    auto clock_pair =
        (ggml_backend_gpu_clock_pair_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_vk_clock_pair");
    if (!set_profiler || !collect_marks || !clock_pair) {
        return nullptr;
    }
    return std::make_unique<vk_op_timer>(backend, device, set_profiler, collect_marks, clock_pair);
}
