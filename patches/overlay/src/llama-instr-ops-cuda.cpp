// llamacpp-instr: the CUDA backend's op timer. Patch 0013 gives ggml-cuda a profiler
// (ggml_cuda_profiler): one-thread kernels writing the device's %globaltimer before the ops it
// selects, after each graph compute and around each copy between the host and the device,
// captured into the CUDA graphs ggml-cuda builds (CUDA graphs stay on) and read once the backend
// is synchronized. At DETAILED every op is marked and an op runs from the end of its mark (what a
// mark takes, measured after each compute's end mark) to the next mark on its stream; at MINIMAL
// only the first op of each layer is, which gives the layer spans. Each graph compute (first mark
// to end mark) is a `busy` stretch; a copy's marks replace the host's times of the scheduler's
// copy row with the device's (the copies the host waits on are marked at DETAILED only). The
// device's clock is put on the host's by a clock pair (a kernel answering the host through mapped
// memory): `globaltimer` in `clocks`, with its uncertainty.

#include "ggml-cuda-instr.h"
#include "llama-instr-env.h"
#include "llama-instr-gpu-marks.h"
#include "llama-instr-ops.h"
#include "llama-instr-session.h"

#include <algorithm>

using namespace llama_instr;

namespace {

// a clock pair is taken again when the last is older than this (ns), and its uncertainty grows
// by CLOCK_DRIFT of the time since it was taken (a bound on two clocks' relative drift)
constexpr int64_t CLOCK_PAIR_MAX_AGE = 100 * 1000 * 1000;
constexpr double  CLOCK_DRIFT        = 100e-6;

// the profiler's selections (ggml_cuda_profiler::selection): each has its own CUDA graphs
constexpr int32_t SELECT_EVERY_OP     = 1;
constexpr int32_t SELECT_LAYER_STARTS = 2;

int64_t host_now() {
    return now_ns();
}

class cuda_op_timer final : public op_timer {
  public:
    cuda_op_timer(ggml_backend_t                       backend,
                  int32_t                              device,
                  ggml_backend_cuda_set_profiler_t     set_profiler,
                  ggml_backend_cuda_profiler_collect_t collect_marks,
                  ggml_backend_gpu_clock_pair_t        clock_pair) :
        op_timer(backend, device),
        set_profiler(set_profiler),
        collect_marks(collect_marks),
        clock_pair(clock_pair) {}

    bool arm(ctx_state & st, const llama_context * ctx, const ggml_cgraph * gf) override {
        if (!env_device(st.epoch).timing) {
            return false;
        }
        if (!queue.empty() && queue.front().step != st.step) {
            queue.clear();  // a step whose records were never written (a failure): its marks go
            q_next = 0;
        }
        if (queue.empty()) {
            prof       = {};
            lost_taken = 0;
        }
        // room after the marks of the step's computes not read yet; at its first, for as many
        // computes as a decode makes (a batch in ubatches), so that its later ones find it; an
        // encoder's compute has no context, and an encode is one graph
        int64_t computes = 1;
        if (ctx) {
            const int64_t n_ubatch = std::max<int64_t>(llama_n_ubatch(ctx), 1);
            computes               = ((int64_t) llama_n_batch(ctx) + n_ubatch - 1) / n_ubatch;
        }
        const size_t cap = (size_t) gpu_marks_room((int64_t) marks.size(), prof.n_marks,
                                                   ggml_graph_n_nodes(const_cast<ggml_cgraph *>(gf)), computes);
        if (marks.size() < cap) {
            marks.resize(cap);
            resolved.resize(cap);
        }
        prof.marks       = marks.data();
        prof.cap         = (int32_t) marks.size();
        prof.user        = this;
        // at MINIMAL the copies the host waits on keep the host's times: two marks cost the host a
        // few us per copy, a few % of a decode token of a small model
        prof.sync_copies = st.level >= LLAMA_INSTR_LEVEL_DETAILED ? 1 : 0;
        if (st.level >= LLAMA_INSTR_LEVEL_DETAILED) {
            prof.selection = SELECT_EVERY_OP;
            prof.want      = nullptr;
        } else {
            prof.selection = SELECT_LAYER_STARTS;
            prof.want      = want_layer_start;
            want_st        = &st;
        }
        armed_at = prof.n_marks;
        return set_profiler(backend, &prof) == 0;
    }

    void disarm() noexcept override { set_profiler(backend, nullptr); }

    bool needs_sync() const override { return false; }

    bool reads_later() const override { return true; }

    // The compute's marks are read in finish, once the host synchronized: here each op's mark is
    // placed in the graph indexed now (the next compute may index another).
    int64_t collect(ctx_state & st, compute_rec & c) override {
        const int32_t end = std::min(prof.n_marks, prof.cap);
        for (int32_t k = armed_at; k < end; k++) {
            resolved[k] = { -1, -1, -1 };
            if (marks[k].kind == GGML_CUDA_PROFILE_OP) {
                const int32_t idx = nodes.find(st, (size_t) (k - armed_at), marks[k].node);
                resolved[k]       = { idx, idx >= 0 ? st.graph.layer[idx] : -1, idx >= 0 ? split_of(st, c, idx) : -1 };
            }
        }
        queue.push_back({ st.step, c.ubatch, armed_at, end });
        const int64_t lost = prof.n_lost - lost_taken;
        lost_taken         = prof.n_lost;
        return lost;
    }

    int64_t finish(ctx_state & st, compute_rec & c) override {
        if (q_next >= queue.size() || queue[q_next].step != st.step || queue[q_next].ubatch != c.ubatch) {
            return 0;  // not a compute this timer measured
        }
        const queued q = queue[q_next++];
        if (q_next == queue.size()) {
            queue.clear();
            q_next = 0;
        }
        const int32_t n = q.end - q.begin;
        if (n <= 0) {
            return 0;  // nothing ran on the device in this compute
        }
        if (collect_marks(backend, &prof, q.begin, q.end) != 0 || !calibrate()) {
            return count_ops(q.begin, q.end);  // no device time read, or none on the host clock
        }
        st.p_clocks.push_back({ device, pair.method, uncertainty });
        copies.clear();
        const bool    detailed = st.level >= LLAMA_INSTR_LEVEL_DETAILED;
        const size_t  op_begin = st.p_ops.size();
        stored_lookup lookup{ resolved.data() + q.begin };
        gpu_walk_out  out{ st.p_ops, st.p_layers, st.p_busy, copies };
        const int64_t n_lost = walk_gpu_marks(marks.data() + q.begin, n, offset, device, detailed, lookup, out);
        if (detailed) {
            append_layer_spans(st, op_begin, st.p_ops.size());
        }
        place_copies(st, c);
        if (out.t_min <= out.t_max) {
            c.t_start = std::min(c.t_start, out.t_min);
            c.t_end   = std::max(c.t_end, out.t_max);
        }
        return n_lost;
    }

  private:
    // a compute's marks, read in finish
    struct queued {
        int64_t step;
        int32_t ubatch;
        int32_t begin, end;
    };

    // each OP mark's node, resolved when its compute ended
    class stored_lookup final : public gpu_node_lookup {
      public:
        explicit stored_lookup(const gpu_node * at) : at(at) {}

        gpu_node find(int32_t k, const ggml_tensor * node) override {
            GGML_UNUSED(node);
            return at[k];
        }

      private:
        const gpu_node * at;
    };

    // the index in this compute's splits of the split holding node idx, or -1
    static int32_t split_of(const ctx_state & st, const compute_rec & c, int32_t idx) {
        for (size_t s = c.split_begin; s < c.split_end; s++) {
            if (st.p_splits[s].i_start <= idx && idx < st.p_splits[s].i_end) {
                return (int32_t) (s - c.split_begin);
            }
        }
        return -1;
    }

    // the ops marks [begin, end) stand for (lost whole when their times can't be read)
    int64_t count_ops(int32_t begin, int32_t end) const {
        int64_t ops = 0;
        for (int32_t k = begin; k < end; k++) {
            ops += marks[k].kind == GGML_CUDA_PROFILE_OP ? std::max(marks[k].n_ops, 1) : 0;
        }
        return ops;
    }

    // MINIMAL: mark an op when it begins a layer (the previous op is of another)
    static bool want_layer_start(void * user, const ggml_tensor * prev, const ggml_tensor * node) {
        auto *              self = (cuda_op_timer *) user;
        const graph_index & g    = self->want_st->graph;
        const int32_t       a    = g.find(prev);
        const int32_t       b    = g.find(node);
        return a < 0 || b < 0 || g.layer[a] != g.layer[b];
    }

    // the device's copies, in order, onto the scheduler's copy rows of this device, in order (the
    // same bytes): the row's time becomes the copy's time on the device's stream
    void place_copies(ctx_state & st, const compute_rec & c) {
        size_t row = c.copy_begin;
        for (const gpu_copy & g : copies) {
            for (size_t r = row; r < c.copy_end; r++) {
                copy_rec & q = st.p_copies[r];
                if ((q.from == device || q.to == device) && q.bytes == g.bytes) {
                    q.t_start = g.t_start;
                    q.t_end   = g.t_end;
                    row       = r + 1;
                    break;
                }
            }
        }
    }

    // a clock pair for this collect (the backend is idle); false if none could be taken
    bool calibrate() {
        const int64_t now = now_ns();
        if (!have_pair || now - pair.host_ns >= CLOCK_PAIR_MAX_AGE) {
            ggml_gpu_clock_pair p = {};
            if (clock_pair(backend, GGML_GPU_CLOCK_ANY, host_now, &p) == 0) {
                pair      = p;
                have_pair = true;
            }
        }
        if (!have_pair) {
            return false;
        }
        // the pair's own error, the timer's step, and the drift since it was taken
        uncertainty = pair.max_deviation_ns + pair.resolution_ns +
                      (int64_t) (CLOCK_DRIFT * (double) std::max<int64_t>(0, now - pair.host_ns));
        offset = pair.host_ns - (int64_t) pair.device_time;
        return true;
    }

    const ggml_backend_cuda_set_profiler_t     set_profiler;
    const ggml_backend_cuda_profiler_collect_t collect_marks;
    const ggml_backend_gpu_clock_pair_t        clock_pair;

    ggml_cuda_profiler                  prof = {};
    std::vector<ggml_cuda_profile_mark> marks;
    std::vector<gpu_node>               resolved;        // per mark
    std::vector<queued>                 queue;           // the computes whose marks are not read yet
    size_t                              q_next     = 0;
    int32_t                             armed_at   = 0;  // the first mark of the compute armed
    int32_t                             lost_taken = 0;  // prof.n_lost already counted
    std::vector<gpu_copy>               copies;
    node_map                            nodes;
    ctx_state *                         want_st = nullptr;

    ggml_gpu_clock_pair pair        = {};
    bool                have_pair   = false;
    int64_t             offset      = 0;  // host ns - device ns
    int64_t             uncertainty = 0;
};

}  // namespace

std::unique_ptr<op_timer> llama_instr::make_cuda_op_timer_from(ggml_backend_t                       backend,
                                                               int32_t                              device,
                                                               ggml_backend_cuda_set_profiler_t     set_profiler,
                                                               ggml_backend_cuda_profiler_collect_t collect_marks,
                                                               ggml_backend_gpu_clock_pair_t        clock_pair) {
    if (!set_profiler || !collect_marks || !clock_pair) {
        return nullptr;
    }
    return std::make_unique<cuda_op_timer>(backend, device, set_profiler, collect_marks, clock_pair);
}

std::unique_ptr<op_timer> llama_instr::make_cuda_op_timer(ggml_backend_t     backend,
                                                          ggml_backend_reg_t reg,
                                                          int32_t            device) {
    auto set_profiler =
        (ggml_backend_cuda_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cuda_set_profiler");
    auto collect_marks = (ggml_backend_cuda_profiler_collect_t) ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_cuda_profiler_collect");
    auto clock_pair =
        (ggml_backend_gpu_clock_pair_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cuda_clock_pair");
    return make_cuda_op_timer_from(backend, device, set_profiler, collect_marks, clock_pair);
}
