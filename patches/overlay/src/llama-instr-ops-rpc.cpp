// llamacpp-instr: the op timer of ggml's RPC devices. A patched server times each op of every graph
// it computes with the CPU backend's profiler and sends the times back in front of the next reply
// it sends (llama-instr-rpc.cpp receives them); this timer places them on the host clock.
//
// When. A graph's command has no reply: its times come with the next reply of that server, which
// for the graph computing the logits is the step's own read of them, made after its computes. So
// collect() only notes the compute, and finish(), at the step's end, once the connection has
// delivered what the step queued, takes the times (one extra round trip only when no reply came).
// Collecting them within the compute would add a round trip to every step (the logits' read would
// wait for the times' fetch).
//
// Placement. The client timed when it began sending the graph's command (t_send) and when the
// reply carrying the times began to arrive (t_recv); the server timed when it read the command's
// first byte (s_recv) and when it began sending that reply (s_reply), on its own clock. Nothing
// arrives before it was sent, so the offset from the server's clock to the host's lies in
// [t_send - s_recv, t_recv - s_reply]; the width of that interval is the round trip less the time
// the server held the command, i.e. the network's share of the round trip (both ways). The ops are
// placed at the interval's middle (equal delays each way); half the width is both the one-way
// network time's estimate and the placement's uncertainty.
//
// The server's clock values are its word only: whatever they say (a clock that jumped, a server
// that lies), every time placed is kept within [t_send, t_recv], which the client measured itself,
// and computed with saturating arithmetic, so that no value overflows.

#include "llama-instr-ops.h"
#include "llama-instr-rpc.h"
#include "llama-instr-session.h"

#include <algorithm>
#include <cstdint>

using namespace llama_instr;

namespace {

// a + b and a - b, held at INT64_MAX or INT64_MIN instead of overflowing
int64_t sat_add(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) {
        return INT64_MAX;
    }
    if (b < 0 && a < INT64_MIN - b) {
        return INT64_MIN;
    }
    return a + b;
}

int64_t sat_sub(int64_t a, int64_t b) {
    if (b < 0 && a > INT64_MAX + b) {
        return INT64_MAX;
    }
    if (b > 0 && a < INT64_MIN + b) {
        return INT64_MIN;
    }
    return a - b;
}

// a server time placed on the host clock, within [lo, hi]
int64_t place(int64_t s, int64_t offset, int64_t lo, int64_t hi) {
    return std::min(std::max(sat_add(s, offset), lo), hi);
}

class rpc_op_timer : public op_timer {
  public:
    rpc_op_timer(ggml_backend_t backend, int32_t device) : op_timer(backend, device) {}

    bool arm(ctx_state & st, const llama_context * ctx, const ggml_cgraph * gf) override {
        (void) st;
        (void) gf;
        // the commands this thread issues until the step's end are ctx's (other contexts may use
        // the same device at the same time); an encode's compute has no context: its encoder
        // owns them, as its encode's start said
        if (ctx) {
            rpc_set_owner(ctx);
        }
        owner = rpc_owner();
        if (remote < 0) {
            // asked once: a server is patched or not for the life of its connection
            remote = rpc_remote_timing(ggml_backend_get_device(backend)) == 1 ? 1 : 0;
        }
        t_arm = now_ns();
        return remote == 1;
    }

    void disarm() noexcept override {}

    int64_t collect(ctx_state & st, compute_rec & c) override {
        if (c.ubatch == 0) {
            pending.clear();  // a new step (what a failed one left is stale)
            splits.clear();
            layers.clear();
        }
        // this device's splits, and their nodes' layers while the graph indexed is this compute's
        // (a later ubatch may index another)
        compute q     = {};
        q.ubatch      = c.ubatch;
        q.t_arm       = t_arm;
        q.t_collect   = now_ns();
        q.split_begin = splits.size();
        for (size_t k = c.split_begin; k < c.split_end; k++) {
            const split_rec & sp = st.p_splits[k];
            if (sp.device != device) {
                continue;
            }
            splits.push_back({ (int32_t) (k - c.split_begin), sp.i_start, sp.i_end, layers.size() });
            for (int32_t i = sp.i_start; i < sp.i_end; i++) {
                layers.push_back(i < st.graph.n_nodes ? st.graph.layer[i] : -1);
            }
        }
        q.split_end = splits.size();
        pending.push_back(q);
        return 0;
    }

    int64_t finish(ctx_state & st, compute_rec & c) override {
        auto p = std::find_if(pending.begin(), pending.end(), [&c](const compute & q) { return q.ubatch == c.ubatch; });
        if (p == pending.end()) {
            return 0;
        }
        const compute q = *p;
        pending.erase(p);
        // what the step queued on the connection is done, and the times of its graphs are here
        rpc_sync_times(backend);
        rpc_take_graphs(device, owner, q.t_arm, q.t_collect, graphs);

        // the device's graphs in the order it ran them: its splits, in order (a remote graph holds
        // its split's nodes in the graph's order: remote node k is node i_start + k)
        int64_t      n_lost   = 0;
        const size_t op_begin = st.p_ops.size();
        size_t       s        = q.split_begin;
        for (const remote_graph & g : graphs) {
            const split_nodes * sn    = s < q.split_end ? &splits[s++] : nullptr;
            const int32_t       split = sn ? sn->split : -1;
            if (!sn || g.n_nodes != sn->i_end - sn->i_start) {
                sn = nullptr;  // not the split's graph: its ops can't be attributed
            }
            // the client's own times (a reply begins to arrive after its command was sent)
            const int64_t t_send = g.t_send;
            const int64_t t_recv = std::max(g.t_recv, t_send);
            const int64_t lo     = sat_sub(t_send, g.s_recv);
            const int64_t hi     = std::max(lo, sat_sub(t_recv, g.s_reply));
            const int64_t half   = (int64_t) (((uint64_t) hi - (uint64_t) lo) / 2);  // (hi >= lo)
            const int64_t offset = sat_add(lo, half);                                // server clock -> host clock

            remote_rec r = {};
            r.split      = split;
            r.device     = device;
            r.bytes      = g.sent;
            r.t_send     = t_send;
            r.t_recv     = t_recv;
            r.t_start    = place(g.s_start, offset, t_send, t_recv);
            r.t_end      = place(g.s_end, offset, r.t_start, t_recv);
            r.one_way    = std::min(half, t_recv - t_send);
            r.err        = r.one_way;
            r.offset     = offset;
            r.n_ops      = 0;
            for (const ggml_rpc_profile_op & op : g.ops) {
                if (!sn || op.node < 0 || op.node >= g.n_nodes) {
                    n_lost++;
                    continue;
                }
                op_rec o       = {};
                o.idx          = sn->i_start + op.node;
                o.layer        = layers[sn->layer_begin + op.node];
                o.n_fused      = op.n_fused;
                o.device       = device;
                o.t_start      = place(op.t_start, offset, t_send, t_recv);
                o.t_end        = place(op.t_end, offset, o.t_start, t_recv);
                o.thread_begin = -1;
                st.p_ops.push_back(o);
                r.n_ops++;
            }
            st.p_remote.push_back(r);
            c.t_start = std::min(c.t_start, r.t_start);
            c.t_end   = std::max(c.t_end, r.t_end);
        }
        append_layer_spans(st, op_begin, st.p_ops.size());
        graphs.clear();
        if (pending.empty()) {
            splits.clear();
            layers.clear();
        }
        return n_lost;
    }

  private:
    // one of the device's splits in a compute: its index in the compute's splits, its nodes, and
    // where their layers are in `layers`
    struct split_nodes {
        int32_t split;
        int32_t i_start, i_end;
        size_t  layer_begin;
    };

    // a compute collected, to finish at the step's end: its graphs were sent in [t_arm, t_collect]
    struct compute {
        int32_t ubatch;
        int64_t t_arm, t_collect;
        size_t  split_begin, split_end;  // into `splits`
    };

    int32_t                   remote = -1;       // 1: the server times graphs, 0: a stock server, -1: not asked yet
    const void *              owner  = nullptr;  // the step owner this timer's computes are for (rpc_set_owner)
    int64_t                   t_arm  = 0;
    std::vector<compute>      pending;
    std::vector<split_nodes>  splits;  // of the step's computes (buffers only grow)
    std::vector<int32_t>      layers;
    std::vector<remote_graph> graphs;
};

}  // namespace

std::unique_ptr<op_timer> llama_instr::make_rpc_op_timer(ggml_backend_t     backend,
                                                         ggml_backend_reg_t reg,
                                                         int32_t            device) {
    (void) reg;
    return std::make_unique<rpc_op_timer>(backend, device);
}
