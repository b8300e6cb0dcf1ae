#include "llama-instr-gpu-marks.h"

#include <algorithm>
#include <climits>

using namespace llama_instr;

namespace {

// the streams a mark may name: the thread's own (-1), then the backend's (0 ..)
constexpr int32_t MAX_STREAMS = 8;

struct open_mark {
    int32_t k     = -1;  // the mark, or -1: none open
    int32_t idx   = -1;  // OP: its node index and layer
    int32_t layer = -1;
    bool    valid = false;
    int64_t t     = 0;
};

// one walk over marks[0, n): the op and the copy open on each stream, what one mark takes in the
// graph compute last scanned, the graph compute being walked and (MINIMAL) the layer span being
// built
class mark_walk {
  public:
    mark_walk(const ggml_cuda_profile_mark * marks,
              int32_t                        n,
              int32_t                        device,
              bool                           detailed,
              gpu_node_lookup &              nodes,
              gpu_walk_out &                 out) :
        marks(marks),
        n(n),
        device(device),
        detailed(detailed),
        nodes(nodes),
        out(out) {
        span.layer = -1;
    }

    // mark k; device times plus `offset` are host times
    void visit(int32_t k, int64_t offset) {
        const ggml_cuda_profile_mark & m    = marks[k];
        const int32_t                  slot = m.stream + 1;
        if (slot < 0 || slot > MAX_STREAMS) {
            n_lost += m.kind == GGML_CUDA_PROFILE_OP ? 1 : 0;
            return;
        }
        const bool    valid = m.valid != 0;
        const int64_t t     = valid ? (int64_t) m.t + offset : 0;
        if (valid) {
            out.t_min = std::min(out.t_min, t);
            out.t_max = std::max(out.t_max, t);
        }

        end_op(op[slot], valid, t);  // this mark ends the op open on its stream

        switch (m.kind) {
            case GGML_CUDA_PROFILE_OP:
                begin_op(op[slot], k, valid, t);
                break;
            case GGML_CUDA_PROFILE_GRAPH_END:
                end_graph(m, valid, t);
                break;
            case GGML_CUDA_PROFILE_COPY_BEGIN:
                copy[slot] = { k, -1, -1, valid, t };
                break;
            case GGML_CUDA_PROFILE_COPY_END:
                end_copy(copy[slot], m, valid, t);
                break;
            default:  // JOIN, FORK: only end their stream's op; CALIB: read by mark_ns
                break;
        }
    }

    // the walk's end: the ops it lost, those still open among them (no later mark on their stream)
    int64_t finish() {
        for (const open_mark & o : op) {
            n_lost += o.k >= 0 ? 1 : 0;
        }
        if (!detailed) {
            end_span();
        }
        return n_lost;
    }

  private:
    const ggml_cuda_profile_mark * marks;
    const int32_t                  n;
    const int32_t                  device;
    const bool                     detailed;
    gpu_node_lookup &              nodes;
    gpu_walk_out &                 out;

    open_mark op[MAX_STREAMS + 1], copy[MAX_STREAMS + 1];
    int64_t   n_lost = 0;

    int32_t cost_graph = INT32_MIN;  // the graph compute mark_ns last scanned, and its cost
    int64_t cost_ns    = 0;

    int32_t g_cur = -1, g_split = -1, g_ops = 0;  // the graph compute being walked
    bool    g_valid = false;
    int64_t g_start = 0;

    layer_rec span = {};  // MINIMAL: the layer span being built

    // what one mark takes in a graph compute (ns): its GRAPH_END mark to the CALIB mark right after
    // it; an op's interval, from its mark to the next, begins with its own mark. Found by a scan
    // from an op's mark to its compute's end, once per compute (its ops come in a run).
    int64_t mark_ns(int32_t from, int32_t graph) {
        if (graph != cost_graph) {
            cost_graph = graph;
            cost_ns    = 0;
            for (int32_t j = from + 1; j + 1 < n; j++) {
                const ggml_cuda_profile_mark & e = marks[j];
                const ggml_cuda_profile_mark & c = marks[j + 1];
                if (e.kind == GGML_CUDA_PROFILE_GRAPH_END && e.graph == graph) {
                    if (c.kind == GGML_CUDA_PROFILE_CALIB && c.graph == graph && c.stream == e.stream && e.valid &&
                        c.valid && c.t >= e.t) {
                        cost_ns = (int64_t) (c.t - e.t);
                    }
                    break;
                }
            }
        }
        return cost_ns;
    }

    void end_span() {
        if (span.layer >= 0 && span.n_ops > 0) {
            out.layers.push_back(span);
        }
        span       = {};
        span.layer = -1;
    }

    // the op open on a stream ends at t: an op record (DETAILED), or its time in its layer's span
    void end_op(open_mark & o, bool valid, int64_t t) {
        if (o.k < 0) {
            return;
        }
        const ggml_cuda_profile_mark & om = marks[o.k];
        if (!o.valid || !valid || t < o.t) {
            n_lost++;
        } else if (detailed) {
            op_rec r       = {};
            r.idx          = o.idx;
            r.layer        = o.layer;
            r.n_fused      = om.n_fused;
            r.device       = device;
            r.t_start      = std::min(o.t + mark_ns(o.k, om.graph), t);
            r.t_end        = t;
            r.thread_begin = -1;
            out.ops.push_back(r);
        } else {
            const int32_t layer = o.layer;
            if (layer != span.layer) {
                end_span();
                span.layer   = layer;
                span.device  = device;
                span.t_start = std::min(o.t + mark_ns(o.k, om.graph), t);
            }
            span.t_end = t;
            span.n_ops += std::max(om.n_ops, 1);
        }
        o = {};
    }

    // an OP mark opens its op on its stream, and a graph compute when it is the graph's first
    void begin_op(open_mark & o, int32_t k, bool valid, int64_t t) {
        const ggml_cuda_profile_mark & m  = marks[k];
        const gpu_node                 nd = nodes.find(k, m.node);
        if (nd.idx < 0) {
            n_lost++;  // not a node of the graph indexed: its time can't be attributed
            return;
        }
        o = { k, nd.idx, nd.layer, valid, t };
        if (m.graph != g_cur) {
            g_cur   = m.graph;
            g_split = nd.split;
            g_ops   = 0;
            g_valid = valid;
            g_start = t;
        }
        g_ops += std::max(m.n_ops, 1);
    }

    void end_graph(const ggml_cuda_profile_mark & m, bool valid, int64_t t) {
        if (m.graph == g_cur && g_valid && valid && t >= g_start) {
            out.busy.push_back({ device, g_split, g_ops, g_start, t });
        }
        g_cur = -1;
        if (!detailed) {
            end_span();  // a layer's span ends with its graph compute
        }
    }

    void end_copy(open_mark & c, const ggml_cuda_profile_mark & m, bool valid, int64_t t) {
        if (c.k >= 0 && c.valid && valid && t >= c.t && marks[c.k].node == m.node) {
            out.copies.push_back({ m.node, m.bytes, m.flags, c.t, t });
        }
        c = {};
    }
};

}  // namespace

int64_t llama_instr::walk_gpu_marks(const ggml_cuda_profile_mark * marks,
                                    int32_t                        n,
                                    int64_t                        offset,
                                    int32_t                        device,
                                    bool                           detailed,
                                    gpu_node_lookup &              nodes,
                                    gpu_walk_out &                 out) {
    mark_walk walk(marks, n, device, detailed, nodes, out);
    for (int32_t k = 0; k < n; k++) {
        walk.visit(k, offset);
    }
    return walk.finish();
}

int64_t llama_instr::gpu_marks_room(int64_t have, int64_t used, int64_t n_nodes, int64_t computes) {
    // a compute's marks: one per op, one per graph compute (a split each) and two per copy: room
    // for a split and a copy per node, and then some
    const int64_t per_compute = 4 * n_nodes + 64;
    // at a step's first compute, room for as many as a decode makes: its later ubatches then
    // find it (a decode of more, its sequences split into smaller ubatches, grows it by half again)
    const int64_t ahead       = std::min<int64_t>(std::max<int64_t>(computes, 1), GPU_MARKS_COMPUTES_AHEAD);
    const int64_t need        = used == 0 ? per_compute * ahead : used + per_compute;
    if (need <= have) {
        return have;
    }
    return used == 0 ? need : std::max(need, have + have / 2);
}
