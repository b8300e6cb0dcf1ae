#pragma once

#include "ggml-backend.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// llamacpp-instr: an optional record of what the RPC client sends and receives, and of the ops its
// servers computed, timed on the servers. Set it through the RPC registry's proc address
// "ggml_backend_rpc_set_profiler" (process-wide; NULL, the default, is off: one branch per
// command). The callbacks run on the connections' own threads, one at a time per connection; the
// pointers they receive are valid only during the call. Client times are ns of CLOCK_MONOTONIC
// (std::chrono::steady_clock) on this host; server times are ns of the server's own clock.
//
// Remote timing needs a patched server: it says so in its HELLO reply (a byte a stock client
// ignores: a magic value and the version of the timing extension; a client times a server only when
// both are its own), and times graphs only for a client that asks, so stock clients and servers,
// and patched ones of another version, work with patched ones unchanged. The times travel in front
// of the next reply the server sends anyway (one small block per graph);
// ggml_backend_rpc_profiler_sync fetches them when no reply follows. Declared here, not in
// ggml-rpc.h, so that llama.cpp's own headers stay as they are.
struct ggml_rpc_profile_transfer {
    ggml_backend_dev_t device;    // the RPC device the command is for (NULL: the connection's own)
    const char *       endpoint;  // host:port
    const char *       cmd;       // the command, e.g. "set_tensor", "get_tensor", "graph_compute"
    const char *       tensor;    // the tensor it moves, "" if none
    int64_t            bytes;     // tensor data moved (0 for a command that moves none)
    int64_t            sent;      // bytes this command wrote to the connection (framing included)
    int64_t            recv;      // bytes of its reply read from it (0: no reply)
    int64_t            t_queue;   // when the caller issued it
    int64_t            t_start;   // when its first byte was written
    int64_t            t_sent;    // when its last byte was written (handed to the kernel)
    int64_t            t_end;     // when its reply was read (t_sent if it has none)
    const void *       owner;     // what the profiler's owner() said on the issuing thread (NULL: none)
};

struct ggml_rpc_profile_op {
    int32_t node;     // index in the graph the client sent (ggml_rpc_profile_graph::nodes)
    int32_t n_fused;  // nodes fused into it (they follow it)
    int64_t t_start;  // server clock, as the server's CPU backend timed it (ggml_cpu_profiler)
    int64_t t_end;
};

struct ggml_rpc_profile_graph {
    ggml_backend_dev_t                 device;
    const char *                       endpoint;
    struct ggml_tensor * const *       nodes;      // the client's nodes of the graph sent (the caller's memory)
    int32_t                            n_nodes;
    int32_t                            recompute;  // 1: GRAPH_RECOMPUTE (the server's stored graph again)
    int32_t                            status;     // the server's ggml_status
    int64_t                            sent;       // bytes of the command
    // client clock
    int64_t                            t_queue;  // ggml_backend_graph_compute was called
    int64_t                            t_send;   // the command's first byte was written
    int64_t                            t_sent;   // its last byte was written
    int64_t                            t_recv;   // the block with these times began to arrive
    // server clock
    int64_t                            s_recv;   // the command's first byte was read
    int64_t                            s_read;   // the command was read whole
    int64_t                            s_start;  // the server's ggml_backend_graph_compute began
    int64_t                            s_end;    // and returned
    int64_t                            s_reply;  // the block with these times began to be written
    int32_t                            n_ops;    // 0 when the server's backend has no op timer (not a CPU)
    const struct ggml_rpc_profile_op * ops;
    const void *                       owner;    // as ggml_rpc_profile_transfer::owner, for its command
};

struct ggml_rpc_profiler {
    void (*on_transfer)(void * user, const struct ggml_rpc_profile_transfer * t);  // every command sent
    void (*on_graph)(void * user, const struct ggml_rpc_profile_graph * g);        // remote_timing only
    void * user;
    bool   remote_timing;  // ask patched servers to time the graphs they compute
    // Optional: called on the thread that issues a command, as it issues it; what it returns comes
    // back with that command's transfer and graph (owner), so that a caller whose threads issue
    // for several users (several contexts on one device) tells their commands apart.
    const void * (*owner)(void * user);
};

typedef void (*ggml_backend_rpc_set_profiler_t)(struct ggml_rpc_profiler * profiler);
// 1: dev's server times graphs (a patched server), 0: it does not (stock), -1: dev is not an RPC device
typedef int32_t (*ggml_backend_rpc_dev_remote_timing_t)(ggml_backend_dev_t dev);
// Every graph computed so far on backend's connection has delivered its times (on_graph) when this
// returns: a round trip only if no reply has brought them yet.
typedef void (*ggml_backend_rpc_profiler_sync_t)(ggml_backend_t backend);

#ifdef __cplusplus
}
#endif
