// llamacpp-instr: ggml-rpc's record of the client's commands and the servers' op times (instr.h,
// ggml-rpc-instr.h): the commands a client sends while a profiler is set, timed and reported; the
// block of times a patched server sends in front of its next reply, and its checks.

#include "instr.h"

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <algorithm>
#include <cstring>
#include <new>

// as ggml-rpc.cpp's RPC_STATUS_ASSERT: the connection failing is fatal to the client
#define RPC_INSTR_ASSERT(x) \
    if (!(x))               \
    GGML_ABORT("Remote RPC server crashed or returned malformed response")

std::atomic<ggml_rpc_profiler *> g_rpc_profiler{ nullptr };
thread_local rpc_instr_note      g_rpc_instr_note = {};

void ggml_backend_rpc_set_profiler(ggml_rpc_profiler * profiler) {
    g_rpc_profiler.store(profiler, std::memory_order_release);  // paired with the workers' acquire
}

static const char * rpc_instr_cmd_name(uint8_t cmd) {
    static const char * names[RPC_INSTR_CMD_COUNT] = {
        "alloc_buffer", "get_alignment",   "get_max_size", "buffer_get_base", "free_buffer",     "buffer_clear",
        "set_tensor",   "set_tensor_hash", "get_tensor",   "copy_tensor",     "graph_compute",   "get_device_memory",
        "init_tensor",  "get_alloc_size",  "hello",        "device_count",    "graph_recompute", "memset_tensor",
        "none",
    };
    return cmd < RPC_INSTR_CMD_COUNT ? names[cmd] : "instr";
}

// ggml-rpc's framing (its send_rpc_cmd, send_msg and recv_msg), for this extension's own messages:
// a command | cmd (1 byte) | size (8 bytes) | bytes |, a message | size (8 bytes) | bytes |
static bool rpc_instr_send_cmd(const socket_ptr & sock, uint8_t cmd, const void * input, size_t input_size) {
    return sock->send_data(&cmd, sizeof(cmd)) && sock->send_data(&input_size, sizeof(input_size)) &&
           sock->send_data(input, input_size) && sock->flush();
}

static bool rpc_instr_send_msg(const socket_ptr & sock, const void * msg, size_t msg_size) {
    return sock->send_data(&msg_size, sizeof(msg_size)) && sock->send_data(msg, msg_size) && sock->flush();
}

static bool rpc_instr_recv_msg(const socket_ptr & sock, void * msg, size_t msg_size) {
    uint64_t size = 0;
    return sock->recv_data(&size, sizeof(size)) && size == msg_size && sock->recv_data(msg, msg_size);
}

// what the caller knows about the command (rpc_instr_note_set), and when it was issued
void rpc_instr_take(rpc_instr_msg & msg) {
    ggml_rpc_profiler * prof = g_rpc_profiler.load(std::memory_order_acquire);
    if (prof == nullptr) {
        g_rpc_instr_note = {};  // a note left from a session that ended: its tensor or graph may be gone
        return;
    }
    const rpc_instr_note & n = g_rpc_instr_note;
    msg.owner                = prof->owner ? prof->owner(prof->user) : nullptr;
    msg.t_queue              = rpc_instr_now();
    msg.device               = n.device;
    msg.bytes                = n.bytes;
    msg.nodes                = n.graph ? n.graph->nodes : nullptr;
    msg.n_nodes              = n.graph ? n.graph->n_nodes : 0;
    snprintf(msg.tensor, sizeof(msg.tensor), "%s", n.tensor ? n.tensor->name : "");
    g_rpc_instr_note = {};
}

// a graph sent, | device | n_nodes | ...: the server computes (and times) at most
// these nodes, and a recompute (| device |) computes that device's last graph again, whenever it
// was sent (timing may begin between them; a server may have several devices, each with its own)
void rpc_instr_client::note_graph(uint8_t cmd, const void * input, size_t input_size) {
    if (cmd != RPC_INSTR_CMD_GRAPH_COMPUTE || input_size < 2 * sizeof(uint32_t)) {
        return;
    }
    uint32_t dev = 0, n_nodes = 0;
    memcpy(&dev, input, sizeof(dev));
    memcpy(&n_nodes, (const uint8_t *) input + sizeof(uint32_t), sizeof(n_nodes));
    if (dev < RPC_INSTR_MAX_DEVICES) {
        last_nodes[dev] = (uint32_t) std::min<uint64_t>(n_nodes, input_size / sizeof(uint64_t));
    }
}

bool rpc_instr_client::work(const socket_ptr &    sock,
                            uint8_t               cmd,
                            const void *          input,
                            size_t                input_size,
                            void *                output,
                            size_t                output_size,
                            const rpc_instr_msg & note) {
    // acquire: the profiler's fields, written before it was set, are seen whole on this thread
    ggml_rpc_profiler * prof = g_rpc_profiler.load(std::memory_order_acquire);
    note_graph(cmd, input, input_size);  // every graph sent, timed or not
    if (!prof && !on && pending.empty() && cmd != RPC_CMD_INSTR_FETCH) {
        return false;
    }
    send(sock, cmd, input, input_size, output, output_size, note, prof);
    return true;
}

// a command sent while the profiler is set, or while graph times are pending: it is
// timed, and a reply is preceded by the block of times when graphs were computed since the last one
void rpc_instr_client::send(const socket_ptr &    sock,
                            uint8_t               cmd,
                            const void *          input,
                            size_t                input_size,
                            void *                output,
                            size_t                output_size,
                            const rpc_instr_msg & note,
                            ggml_rpc_profiler *   prof) {
    const bool want = prof && prof->remote_timing && server_times() && !broken;
    if (prof && prof->remote_timing && !server_times() && hello != 0 && !broken) {
        // said once, when timing is asked for: a patched server of another version, or a byte of upstream's
        GGML_LOG_WARN(
            "ggml-rpc: %s offers op timing this build does not speak (HELLO byte 0x%02x, expected "
            "0x%02x): remote op timing is off for this server\n",
            endpoint.c_str(), hello, RPC_INSTR_HELLO);
        broken = true;
    }
    if (want != on) {
        const uint8_t flag = want ? 1 : 0;
        RPC_INSTR_ASSERT(rpc_instr_send_cmd(sock, RPC_CMD_INSTR_TIMING, &flag, sizeof(flag)));
        on = want;
    }
    const bool fetch = cmd == RPC_CMD_INSTR_FETCH;
    if (fetch && pending.empty()) {
        return;  // the times came with an earlier reply
    }
    const int64_t t_start = rpc_instr_now();
    RPC_INSTR_ASSERT(rpc_instr_send_cmd(sock, cmd, input, input_size));
    const int64_t t_sent = rpc_instr_now();
    const int64_t sent   = 1 + sizeof(uint64_t) + (int64_t) input_size;
    if (on && (cmd == RPC_INSTR_CMD_GRAPH_COMPUTE || cmd == RPC_INSTR_CMD_GRAPH_RECOMPUTE) &&
        input_size >= sizeof(uint32_t)) {
        uint32_t dev = 0;
        memcpy(&dev, input, sizeof(dev));
        const uint32_t max_nodes = dev < RPC_INSTR_MAX_DEVICES ? last_nodes[dev] : 0;
        pending.push_back({ note, cmd == RPC_INSTR_CMD_GRAPH_RECOMPUTE, sent, t_start, t_sent, max_nodes });
    }
    int64_t recv = 0;
    if (output || fetch) {
        // a block that cannot be read is the connection failing (as a reply that cannot be read); a
        // malformed one turns timing off for this server and the run goes on
        RPC_INSTR_ASSERT(pending.empty() || read_times(sock, prof) >= 0);
        uint64_t out_size = 0;
        RPC_INSTR_ASSERT(sock->recv_data(&out_size, sizeof(out_size)) && out_size == output_size);
        RPC_INSTR_ASSERT(sock->recv_data(output, output_size));
        recv = sizeof(uint64_t) + (int64_t) out_size;
    }
    if (prof && prof->on_transfer && !fetch) {
        ggml_rpc_profile_transfer t = {};
        t.device                    = note.device;
        t.endpoint                  = endpoint.c_str();
        t.cmd                       = rpc_instr_cmd_name(cmd);
        t.tensor                    = note.tensor;
        t.bytes                     = note.bytes;
        t.sent                      = sent;
        t.recv                      = recv;
        t.t_queue                   = note.t_queue ? note.t_queue : t_start;
        t.t_start                   = t_start;
        t.t_sent                    = t_sent;
        t.t_end                     = recv ? rpc_instr_now() : t_sent;
        t.owner                     = note.owner;
        prof->on_transfer(prof->user, &t);
    }
}

// a block of times (| rpc_instr_block | per graph: rpc_instr_graph, n_ops *
// rpc_instr_op |) checked against the graphs it answers, whose node counts are max_nodes[0..n):
// nullptr if every count and index is within them and each op starts after the nodes of the one
// before it (so that a graph's ops name each node once at most), else what is wrong. With `emit`,
// each graph's times are then handed to emit(k, graph, ops, n_ops), ops in `scratch` (max_nodes[k]
// entries). The bytes come from the network: nothing in them is trusted before it is checked.
template <typename Emit>
static const char * rpc_instr_parse_times(const uint8_t *                    data,
                                          size_t                             size,
                                          const uint32_t *                   max_nodes,
                                          size_t                             n,
                                          rpc_instr_block &                  block,
                                          std::vector<ggml_rpc_profile_op> * scratch,
                                          Emit &&                            emit) {
    if (size < sizeof(block)) {
        return "shorter than its header";
    }
    memcpy(&block, data, sizeof(block));
    if ((uint64_t) block.n_graphs + block.n_dropped != n) {
        return "not one entry per graph sent";
    }
    for (int pass = 0; pass < (scratch ? 2 : 1); pass++) {
        const uint8_t * p   = data + sizeof(block);
        const uint8_t * end = data + size;
        for (uint32_t k = 0; k < block.n_graphs; k++) {
            rpc_instr_graph g;
            if ((size_t) (end - p) < sizeof(g)) {
                return "truncated";
            }
            memcpy(&g, p, sizeof(g));
            p += sizeof(g);
            if (g.n_ops > max_nodes[k]) {
                return "more ops than the graph has nodes";
            }
            if ((size_t) (end - p) / sizeof(rpc_instr_op) < g.n_ops) {
                return "truncated";
            }
            int64_t t    = g.s_ops;
            int64_t next = 0;  // the first node the next op may start at
            for (uint32_t i = 0; i < g.n_ops; i++) {
                rpc_instr_op op;
                memcpy(&op, p, sizeof(op));
                p += sizeof(op);
                if (op.node < 0 || op.n_fused < 0 || (int64_t) op.node + op.n_fused >= (int64_t) max_nodes[k]) {
                    return "an op outside its graph";
                }
                // each op starts after the nodes of the one before it (fused ones included), as the
                // graph runs them: ops that overlapped would name some nodes again and again
                if (op.node < next) {
                    return "ops out of order or overlapping";
                }
                next = (int64_t) op.node + op.n_fused + 1;
                if (pass == 1) {
                    (*scratch)[i] = { op.node, op.n_fused, t, op.t_end };
                }
                t = op.t_end;
            }
            if (pass == 1) {
                emit(k, g, scratch->data(), g.n_ops);
            }
        }
        if (p != end) {
            return "longer than its entries";
        }
    }
    return nullptr;
}

// size bytes read and dropped through a small buffer, so that the reply after them is read as it
// should be; false if the connection failed
static bool rpc_instr_drain(const socket_ptr & sock, uint64_t size) {
    uint8_t chunk[4096];
    for (uint64_t left = size; left > 0;) {
        const size_t n = (size_t) std::min<uint64_t>(left, sizeof(chunk));
        if (!sock->recv_data(chunk, n)) {
            return false;
        }
        left -= n;
    }
    return true;
}

bool rpc_instr_client::pending_bounds(uint64_t & cap, uint32_t & widest, std::vector<uint32_t> & max_nodes) const {
    cap    = sizeof(rpc_instr_block);
    widest = 0;
    try {
        max_nodes.reserve(pending.size());
        for (const graph & pg : pending) {
            cap += sizeof(rpc_instr_graph) + (uint64_t) pg.max_nodes * sizeof(rpc_instr_op);
            widest = std::max(widest, pg.max_nodes);
            max_nodes.push_back(pg.max_nodes);
        }
    } catch (const std::bad_alloc &) {
        return false;
    }
    return true;
}

void rpc_instr_client::hand_on(ggml_rpc_profiler *         prof,
                               const graph &               pg,
                               const rpc_instr_graph &     g,
                               const rpc_instr_block &     block,
                               const ggml_rpc_profile_op * g_ops,
                               uint32_t                    n_ops,
                               int64_t                     t_recv) const {
    ggml_rpc_profile_graph r = {};
    r.device                 = pg.note.device;
    r.endpoint               = endpoint.c_str();
    r.nodes                  = pg.note.nodes;
    r.n_nodes                = pg.note.n_nodes;
    r.recompute              = pg.recompute;
    r.status                 = g.status;
    r.sent                   = pg.sent;
    r.t_queue                = pg.note.t_queue ? pg.note.t_queue : pg.t_send;
    r.t_send                 = pg.t_send;
    r.t_sent                 = pg.t_sent;
    r.t_recv                 = t_recv;
    r.s_recv                 = g.s_recv;
    r.s_read                 = g.s_read;
    r.s_start                = g.s_start;
    r.s_end                  = g.s_end;
    r.s_reply                = block.s_reply;
    r.n_ops                  = (int32_t) n_ops;
    r.ops                    = g_ops;
    r.owner                  = pg.note.owner;
    prof->on_graph(prof->user, &r);
}

// the block of times in front of a reply, one entry per graph pending. 1: read;
// 0: malformed, dropped (the stream stays in step: its size was read whole), timing off for this
// server from the next command; -1: the connection failed.
int rpc_instr_client::read_times(const socket_ptr & sock, ggml_rpc_profiler * prof) {
    uint64_t size = 0;
    if (!sock->recv_data(&size, sizeof(size))) {
        return -1;
    }
    const int64_t         t_recv = rpc_instr_now();
    // never more than the graphs pending can need
    uint64_t              cap    = 0;
    uint32_t              widest = 0;
    std::vector<uint32_t> max_nodes;
    if (!pending_bounds(cap, widest, max_nodes)) {
        return -1;
    }
    const char * bad = nullptr;
    if (size > cap) {
        bad = "larger than its graphs can need";
        if (!rpc_instr_drain(sock, size)) {
            return -1;
        }
    } else {
        try {
            buf.resize(size);
            ops.resize(std::max<size_t>(ops.size(), widest));
        } catch (const std::bad_alloc &) {
            return -1;
        }
        if (!sock->recv_data(buf.data(), size)) {
            return -1;
        }
        // checked whole before any of it is handed on; handed on only to a profiler that takes it
        rpc_instr_block block;
        const bool      emit = prof && prof->on_graph;
        bad = rpc_instr_parse_times(buf.data(), size, max_nodes.data(), max_nodes.size(), block, emit ? &ops : nullptr,
                                    [&](uint32_t k, const rpc_instr_graph & g, const ggml_rpc_profile_op * g_ops,
                                        uint32_t n_ops) { hand_on(prof, pending[k], g, block, g_ops, n_ops, t_recv); });
    }
    pending.clear();
    if (bad) {
        if (!broken) {
            GGML_LOG_WARN(
                "ggml-rpc: %s sent a malformed block of op times (%s): its times are dropped and remote "
                "op timing is off for this server\n",
                endpoint.c_str(), bad);
        }
        broken = true;
        return 0;
    }
    return 1;
}

int rpc_instr_server::command(const socket_ptr & sock, uint8_t cmd) {
    t_cmd = on ? rpc_instr_now() : 0;
    if (cmd == RPC_CMD_INSTR_TIMING) {
        uint8_t flag = 0;
        if (!rpc_instr_recv_msg(sock, &flag, sizeof(flag))) {
            return -1;
        }
        on = flag != 0;
        return 1;
    }
    if (cmd == RPC_CMD_INSTR_FETCH) {
        if (!rpc_instr_recv_msg(sock, nullptr, 0)) {
            return -1;
        }
        // an empty reply, behind the times pending
        return send_times(sock) && rpc_instr_send_msg(sock, nullptr, 0) ? 1 : -1;
    }
    return 0;
}

ggml_status rpc_instr_server::compute(ggml_backend_t backend, uint32_t device, ggml_cgraph * graph, int64_t t_read) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(backend));
    auto               set_profiler =
        (ggml_backend_cpu_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_profiler");
    ggml_cpu_profiler prof = {};
    if (set_profiler) {
        ops.resize(std::max<size_t>(ops.size(), (size_t) graph->n_nodes + 16));
        prof.ops = ops.data();
        prof.cap = (int32_t) ops.size();
        set_profiler(backend, &prof);
    }
    const int64_t t_start = rpc_instr_now();
    ggml_status   status  = ggml_backend_graph_compute(backend, graph);
    const int64_t t_end   = rpc_instr_now();
    if (set_profiler) {
        set_profiler(backend, nullptr);
    }
    if (block.empty()) {
        block.resize(sizeof(rpc_instr_block));
    }
    const size_t n = block.size();
    if (n_dropped > 0 || n + sizeof(rpc_instr_graph) + prof.n_ops * sizeof(rpc_instr_op) > RPC_INSTR_MAX_BLOCK) {
        n_dropped++;  // a client that does not read replies: only counted from here on
        return status;
    }
    rpc_instr_graph g = { device, (int32_t) status, (uint32_t) prof.n_ops, 0, t_cmd, t_read, t_start,
                          t_end,  prof.t_start };
    block.resize(n + sizeof(g) + prof.n_ops * sizeof(rpc_instr_op));
    memcpy(block.data() + n, &g, sizeof(g));
    for (int32_t k = 0; k < prof.n_ops; k++) {
        rpc_instr_op op = { prof.ops[k].node_idx, prof.ops[k].n_fused, prof.ops[k].t_end };
        memcpy(block.data() + n + sizeof(g) + k * sizeof(op), &op, sizeof(op));
    }
    n_graphs++;
    return status;
}

bool rpc_instr_server::send_times(const socket_ptr & sock) {
    if (n_graphs > 0 || n_dropped > 0) {
        rpc_instr_block head = { n_graphs, n_dropped, rpc_instr_now() };
        memcpy(block.data(), &head, sizeof(head));
        if (!rpc_instr_send_msg(sock, block.data(), block.size())) {
            return false;
        }
        block.clear();
        n_graphs  = 0;
        n_dropped = 0;
    }
    return true;
}
