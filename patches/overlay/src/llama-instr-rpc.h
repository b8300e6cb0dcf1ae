#pragma once

// llamacpp-instr: ggml's RPC backend, recorded through its profiler (ggml-rpc-instr.h, patch 0007).
//
// One recorder per process, as ggml-rpc's profiler is: it keeps every command the client sends to
// an RPC server (written as `transfers` records: the model's upload before a session, a step's
// inputs and outputs, the graphs sent), and the graphs patched servers timed, until the RPC op
// timer of the compute that ran them takes them (llama-instr-ops-rpc.cpp). The callbacks run on
// ggml-rpc's connection threads; everything here is guarded by the recorder's own lock, which is
// never held while the session's is taken.

#include "ggml-backend.h"
#include "ggml-rpc-instr.h"
#include "ggml-rpc.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llama_instr {

// a graph a patched server computed and timed, client times on the host clock, server times on
// the server's
struct remote_graph {
    int32_t                          device;  // index into session_start.machine.devices, or -1
    const void *                     owner;   // the step's owner that issued it (rpc_set_owner), or nullptr
    ggml_tensor * const *            nodes;   // the client's nodes of the graph sent
    int32_t                          n_nodes;
    int32_t                          recompute;
    int32_t                          status;
    int64_t                          sent;
    int64_t                          t_queue, t_send, t_sent, t_recv;
    int64_t                          s_recv, s_read, s_start, s_end, s_reply;
    std::vector<ggml_rpc_profile_op> ops;  // server clock
};

// Keep the RPC commands sent from now until the next session begins, which writes them first as
// `transfers` records of phase "load" (the model's upload, when called before a model loads);
// false stops and forgets them. Returns false when the build has no RPC backend.
bool rpc_record_load(bool on);

// llama_instr_session_begin, under the session lock once session_start is written: the lines of
// the commands kept before the session (phase "load"), appended to `lines`; from now on, commands
// are kept for the session and patched servers time the graphs they compute. Until the session's
// first step ends, the commands it sends outside steps are the load's too (a program may open the
// session at a context it makes before loading its model, e.g. to fit its parameters).
void rpc_session_begin(const std::string & sid, std::vector<std::string> & lines);

// llama_instr_session_end, under the session lock: the lines of the commands not written yet; the
// recording stops.
void rpc_session_end(const std::string & sid, std::vector<std::string> & lines);

// On the thread that runs a step: the RPC commands this thread issues from now until the step's
// end (rpc_step_lines) are owner's, so that several contexts on one device each take their own
// commands and graphs, not each other's. The owner is the step's registry key: a llama_context,
// set as each compute of its decode begins, or an encoder, set as its encode begins (before the
// encode sends its input, which it does ahead of its compute).
void rpc_set_owner(const void * owner);

// The owner this thread's commands have now (nullptr: none).
const void * rpc_owner();

// At the end of a step of owner (before its step_end; the session lock not held): once sched's
// RPC backends have finished what the step queued, the lines of the commands made since the last
// ones written, other owners' steps' excepted: those issued since t_step (the step's start) with
// the step's ctx and step, any earlier ones apart. Nothing when no command was recorded. sched
// may be null (a step that computed nothing). This thread's commands have no owner after it.
void rpc_step_lines(const void *               owner,
                    ggml_backend_sched_t       sched,
                    const std::string &        sid,
                    int32_t                    ctx_id,
                    int64_t                    step,
                    int64_t                    t_step,
                    std::vector<std::string> & lines);

// 1: dev's server times the graphs it computes (a patched server), 0: it does not (a stock one),
// -1: dev is no RPC device, or the build has no RPC backend.
int32_t rpc_remote_timing(ggml_backend_dev_t dev);

// Every graph backend's connection sent so far has delivered its times (a round trip only when no
// reply has brought them yet).
void rpc_sync_times(ggml_backend_t backend);

// Move the graphs device's server timed that owner's steps (or no step's) issued in [t_since,
// t_until] into out (cleared first), in the order they were sent; older ones of that device and
// owner are dropped, later ones and other owners' kept.
void rpc_take_graphs(int32_t                     device,
                     const void *                owner,
                     int64_t                     t_since,
                     int64_t                     t_until,
                     std::vector<remote_graph> & out);

}  // namespace llama_instr
