#pragma once

// llamacpp-instr: ggml-rpc's record of the client's commands and the servers' op times
// (ggml-rpc-instr.h). ggml-rpc.cpp notes what each command is for (rpc_instr_note_set), hands the
// dispatcher's worker each command (rpc_instr_client::work) and the server each graph it computes
// and each reply it sends (rpc_instr_server); the protocol's extension and its checks are here.

#include "ggml-backend.h"
#include "ggml-cpu-instr.h"
#include "ggml-rpc-instr.h"
#include "transport.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

// A patched server sets its HELLO reply's padding byte (0 in the pin, and ignored by stock clients)
// to RPC_INSTR_HELLO: a magic value in the low nibble and the version of this extension (these two
// commands and the block of times) in the high one. Only when that byte is exactly its own does a
// patched client send the server these commands (in rpc_cmd's range, past its commands); any other
// value (a stock server's 0, a future upstream use of the byte, the bare bit 0x01 of builds before
// the magic, another version's layout) leaves the server untimed. The magic's bit 0 is clear, so
// that builds before it never time a server of this one.
static constexpr uint8_t RPC_INSTR_HELLO_MAGIC   = 0x0A;
static constexpr uint8_t RPC_INSTR_HELLO_VERSION = 2;  // 1: the bare bit 0x01
static constexpr uint8_t RPC_INSTR_HELLO         = (RPC_INSTR_HELLO_VERSION << 4) | RPC_INSTR_HELLO_MAGIC;
static constexpr uint8_t RPC_CMD_INSTR_TIMING =
    30;  // | on (1 byte) |, no reply: time the graphs computed from now on, or stop
static constexpr uint8_t RPC_CMD_INSTR_FETCH = 31;  // empty, empty reply: brings the times still pending

// the pin's commands this file reads (ggml-rpc.cpp's enum rpc_cmd, checked there), and their count
static constexpr uint8_t RPC_INSTR_CMD_GRAPH_COMPUTE   = 10;
static constexpr uint8_t RPC_INSTR_CMD_GRAPH_RECOMPUTE = 16;
static constexpr uint8_t RPC_INSTR_CMD_COUNT           = 19;

#pragma pack(push, 1)

// While a client has asked for timing, the server keeps the times of each graph it computes, and
// sends them all as one message in front of its next reply:
// | rpc_instr_block | per graph: rpc_instr_graph, then n_ops * rpc_instr_op |
// An op starts where the one before it ended (the first one at s_ops): the CPU backend's profiler
// times each op from the barrier that ended the previous one.
struct rpc_instr_block {
    uint32_t n_graphs;   // graphs whose times follow
    uint32_t n_dropped;  // graphs computed after those, whose times the server did not keep (its cap)
    int64_t  s_reply;
};

struct rpc_instr_graph {
    uint32_t device;
    int32_t  status;
    uint32_t n_ops;
    uint32_t unused;
    int64_t  s_recv, s_read, s_start, s_end, s_ops;
};

struct rpc_instr_op {
    int32_t node;
    int32_t n_fused;
    int64_t t_end;
};

#pragma pack(pop)

// The server keeps at most this many bytes of times for a client that does not read its replies;
// the graphs computed past it are only counted.
static constexpr size_t RPC_INSTR_MAX_BLOCK = 16u << 20;

// The client bounds the times of a server's first this many devices (a graph of another is taken
// for one of no nodes: its times are refused as malformed).
static constexpr uint32_t RPC_INSTR_MAX_DEVICES = 256;

// the profiler set (ggml_backend_rpc_set_profiler), null: off
extern std::atomic<ggml_rpc_profiler *> g_rpc_profiler;

static inline int64_t rpc_instr_now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// what the next command issued by this thread is for, told by the callers that know
struct rpc_instr_note {
    ggml_backend_dev_t  device;
    const ggml_tensor * tensor;
    int64_t             bytes;
    const ggml_cgraph * graph;
};

extern thread_local rpc_instr_note g_rpc_instr_note;

static inline void rpc_instr_note_set(ggml_backend_dev_t  device,
                                      const ggml_tensor * tensor,
                                      size_t              bytes,
                                      const ggml_cgraph * graph = nullptr) {
    if (g_rpc_profiler.load(std::memory_order_relaxed)) {
        g_rpc_instr_note = { device, tensor, (int64_t) bytes, graph };
    }
}

// what a command is for, noted when it is issued with the profiler set
struct rpc_instr_msg {
    int64_t               t_queue               = 0;
    ggml_backend_dev_t    device                = nullptr;
    int64_t               bytes                 = 0;
    ggml_tensor * const * nodes                 = nullptr;
    int32_t               n_nodes               = 0;
    char                  tensor[GGML_MAX_NAME] = {};
    const void *          owner                 = nullptr;  // ggml_rpc_profiler::owner on the issuing thread
};

// on the issuing thread: what the caller noted (rpc_instr_note_set), and when the command was issued
void rpc_instr_take(rpc_instr_msg & msg);

// a client's connection to one server: its dispatcher's worker sends every command through work()
struct rpc_instr_client {
    std::string endpoint;
    uint8_t     hello = 0;  // the server's HELLO reply's padding byte

    // the server said it can time graphs
    bool server_times() const { return hello == RPC_INSTR_HELLO; }

    // the command `cmd` | input |, expecting output_size bytes of reply in output (null: none):
    // every graph sent is noted; false if the command is left to the caller to send (no profiler
    // set, no times pending), else it was sent here, timed, with the times of the graphs computed
    // since read from in front of its reply
    bool work(const socket_ptr &    sock,
              uint8_t               cmd,
              const void *          input,
              size_t                input_size,
              void *                output,
              size_t                output_size,
              const rpc_instr_msg & note);

  private:
    struct graph {
        rpc_instr_msg note;
        int32_t       recompute;
        int64_t       sent, t_send, t_sent;
        uint32_t      max_nodes;  // the nodes of the graph sent: what bounds its times
    };

    bool                 on                                = false;  // the server times the graphs it computes
    bool                 broken                            = false;  // it sent a malformed block: timing stays off
    uint32_t             last_nodes[RPC_INSTR_MAX_DEVICES] = {};     // per device: nodes of the last graph sent
    std::vector<graph>   pending;                                    // graphs sent since, whose times have not come
    std::vector<uint8_t> buf;
    std::vector<ggml_rpc_profile_op> ops;

    void note_graph(uint8_t cmd, const void * input, size_t input_size);
    void send(const socket_ptr &    sock,
              uint8_t               cmd,
              const void *          input,
              size_t                input_size,
              void *                output,
              size_t                output_size,
              const rpc_instr_msg & note,
              ggml_rpc_profiler *   prof);
    int  read_times(const socket_ptr & sock, ggml_rpc_profiler * prof);
    // the graphs pending: the most bytes their times can take (cap), their widest and each one's
    // nodes; false if out of memory
    bool pending_bounds(uint64_t & cap, uint32_t & widest, std::vector<uint32_t> & max_nodes) const;
    // a graph's times, as the server sent them, handed to the profiler with what was noted of it
    void hand_on(ggml_rpc_profiler *         prof,
                 const graph &               pg,
                 const rpc_instr_graph &     g,
                 const rpc_instr_block &     block,
                 const ggml_rpc_profile_op * g_ops,
                 uint32_t                    n_ops,
                 int64_t                     t_recv) const;
};

// a server's side of a client's connection: the graphs it times, and the times not sent yet
struct rpc_instr_server {
    bool    on    = false;  // the client asked for timing
    int64_t t_cmd = 0;      // when the command being served was received

    // a command received (`cmd`, its first byte): 1 if it was one of this extension's and was
    // served, 0 if it is ggml-rpc's own, -1 if the connection failed
    int command(const socket_ptr & sock, uint8_t cmd);

    // a graph computed while `on`: with the CPU backend's op timer (other backends: the graph's
    // time only), its times kept for the next reply; t_read: when the command was read
    ggml_status compute(ggml_backend_t backend, uint32_t device, ggml_cgraph * graph, int64_t t_read);

    // before a reply: the times of the graphs computed since the last one, as one message
    bool send_times(const socket_ptr & sock);

  private:
    uint32_t                         n_graphs  = 0;
    uint32_t                         n_dropped = 0;
    std::vector<uint8_t>             block;  // rpc_instr_block, then each graph's times
    std::vector<ggml_cpu_profile_op> ops;    // the CPU profiler's buffer
};

// the registry's proc address (ggml-rpc-instr.h)
void ggml_backend_rpc_set_profiler(ggml_rpc_profiler * profiler);
