#pragma once

// llamacpp-instr: the session (the one open log of the process) and the per-context state the
// hooks work with.
//
// Lifetimes: the session lives from llama_instr_session_begin to llama_instr_session_end, and each
// begin starts a new epoch. A context's state lives as long as the llama_context (it is freed by
// llama_instr_context_free from ~llama_context), never shorter, so a hook or a running compute on
// another thread can't be left with freed memory when a session ends. A state joins the open
// session at the start of each step; records it formats carry the epoch they were made in, and
// emit() drops those of a session that has ended since.

#include "ggml-backend-instr.h"
#include "ggml-backend.h"
#include "llama-instr-experts.h"
#include "llama-instr-graph.h"
#include "llama-instr-json.h"
#include "llama-instr-ops.h"
#include "llama-instr-sampling.h"
#include "llama-instr-stats.h"
#include "llama-instr.h"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

struct llama_context;

namespace llama_instr {

int64_t now_ns();  // ns: the clock of ggml-cpu's profiler (ggml_cpu_profiler_now), on every platform

// what one timed op measured, on the host clock; records are formatted after the step ends
struct op_rec {
    int32_t idx;      // node index in the graph table
    int32_t layer;    // its layer, or -1
    int32_t n_fused;  // following nodes fused into it
    int32_t device;   // the device that ran it (index into session_start.machine.devices)
    int64_t t_start;
    int64_t t_end;
    int64_t thread_begin;  // into ctx_state::p_threads (compute_rec::n_threads entries), or -1
};

// one layer's span on one device: its timed ops' first start to last end, on the host clock
struct layer_rec {
    int32_t layer;
    int32_t device;
    int32_t n_ops;
    int64_t t_start;
    int64_t t_end;
};

// a stretch of work a device ran, timed by the device (a Vulkan command buffer: its first command
// to its last), on the host clock
struct busy_rec {
    int32_t device;
    int32_t split;  // index into the compute's splits of the split its first op is of, or -1
    int32_t n_ops;  // ops it ran
    int64_t t_start, t_end;
};

// how a device's timestamps were put on the host clock for a compute
struct clock_rec {
    int32_t device;
    int32_t method;       // enum ggml_gpu_clock_method (ggml-gpu-marks-instr.h): the driver's calibration,
                          // a fenced timestamp, or a CUDA kernel's %globaltimer answering the host
    int64_t uncertainty;  // ns, +-
};

// one split of a compute, as ggml's scheduler ran it
struct split_rec {
    int32_t device;  // index into session_start.devices
    int32_t i_start, i_end;
    int64_t t_start, t_launch, t_end;
};

// one tensor copied between backends for a split
struct copy_rec {
    int32_t split;     // index into the compute's splits
    int32_t node;      // the tensor's node index in the graph table, or -1 (a weight, an input...)
    char    name[GGML_MAX_NAME];
    int32_t from, to;  // devices
    int64_t bytes;
    int64_t t_start, t_end;
};

// a graph an RPC server computed and timed (llama-instr-ops-rpc.cpp), placed on the host clock
struct remote_rec {
    int32_t split;           // index into the compute's splits, or -1
    int32_t device;          // the RPC device
    int64_t t_send;          // the client began sending the graph's command
    int64_t t_recv;          // the reply carrying its times began to arrive
    int64_t t_start, t_end;  // the server's compute of it
    int64_t one_way;         // estimated one-way network time
    int64_t err;             // the placement's uncertainty (+-)
    int64_t offset;          // the server's clock to the host's
    int64_t bytes;           // of the command
    int32_t n_ops;           // its ops in p_ops
};

struct compute_rec {
    int32_t ubatch, graph_id, n_tokens, status, n_threads;
    int64_t t_start, t_end;
    int64_t t_synced;                  // host time when the backends were synchronized after it
    size_t  split_begin, split_end;    // into ctx_state::p_splits
    size_t  copy_begin, copy_end;      // into ctx_state::p_copies
    size_t  op_begin, op_end;          // into ctx_state::p_ops
    size_t  layer_begin, layer_end;    // into ctx_state::p_layers
    size_t  busy_begin, busy_end;      // into ctx_state::p_busy
    size_t  clock_begin, clock_end;    // into ctx_state::p_clocks
    size_t  stat_begin, stat_end;      // into ctx_state::p_stats
    size_t  remote_begin, remote_end;  // into ctx_state::p_remote
    size_t  expert_begin, expert_end;  // into ctx_state::experts.p_rows
    int64_t expert_read_dur;           // ns a device spent copying its routers' rankings to the host (-1: none)
    size_t  etok_begin, etok_end;      // into ctx_state::experts.p_tok
    // what op timers could only report at the step's end (op_timer::finish), after every compute's
    size_t  late_op_begin, late_op_end;        // into ctx_state::p_ops
    size_t  late_layer_begin, late_layer_end;  // into ctx_state::p_layers
    size_t  late_busy_begin, late_busy_end;    // into ctx_state::p_busy
    size_t  late_clock_begin, late_clock_end;  // into ctx_state::p_clocks
};

// An encoder of tools/mtmd (a clip context) in place of a llama_context (llama-instr-media.cpp):
// what llama_instr_encoder_describe said of it, and its encodes in this process.
struct encoder_info {
    std::string projector;
    int32_t     modality   = 0;  // enum llama_instr_media_kind
    int32_t     n_layer    = 0;
    int32_t     n_embd     = 0;
    int32_t     n_embd_out = 0;
    int32_t     image_size = 0;
    int32_t     patch_size = 0;
    int64_t     n_encodes  = 0;                    // encodes begun in this process (the first computes its graph first)
    uint64_t    described  = 0;                    // the session epoch whose `context` record said so

    ggml_backend_sched_t sched         = nullptr;  // the scheduler of the encode's compute
    int32_t              n_threads     = 0;        // of the CPU backend, for the encode
    int64_t              t_entry_begin = 0;        // when llama_instr_encode_begin was entered
};

struct ctx_state {
    // this context in the current session; written by the thread that decodes it (in ctx_join)
    uint64_t    epoch = 0;                      // 0 = never joined
    int32_t     id    = 0;
    int32_t     level = LLAMA_INSTR_LEVEL_OFF;  // of the current step (sampling: MINIMAL or the session's)
    int32_t     topk  = 10;
    std::string sid;
    int32_t     file_index = 0;      // the session's file its last step was written to
    bool        step_open  = false;  // a step of this context is counted in the session's open steps
    bool        step_waits = false;  // ... and in its deferred steps (step_deferred)

    // session_begin(ctx) reserves an id for ctx in its session (ctx 1, as in session_start), which
    // ctx takes when its next step joins (under the session lock)
    uint64_t reserved_epoch = 0;
    int32_t  reserved_id    = 0;

    // the request the context's steps are for (set by llama_instr_set_request under the session
    // lock; copied into `request` when a step begins)
    std::string request_next;
    std::string request;

    // --sample-requests: whether the request running on the whole context (llama_instr_request_begin
    // with seq -1) and on each sequence id is recorded in detail: 1 yes, 0 no, -1 no request; set
    // under the session lock in session sample_epoch (a context may begin requests before its
    // first step joins the session)
    uint64_t            sample_epoch = 0;
    int8_t              request_full = -1;
    std::vector<int8_t> seq_full;

    // the sequences of the current batch: seq id, tokens, first and last position
    struct seq_info {
        int32_t seq;
        int32_t n_tokens;
        int64_t pos0, pos1;
    };

    std::vector<seq_info> seqs;

    // the graph currently built for this context, and its node table once captured (nullptr
    // before: captured at DETAILED, for the graph's first compute the session records)
    graph_index                  graph;
    std::shared_ptr<graph_table> graph_captured;
    int32_t                      graph_id      = 0;      // 0 = not announced in this session yet
    bool                         graph_emitted = false;
    bool                         graph_fresh   = false;  // indexed by llama_instr_graph_built for the next compute

    // Graphs indexed before, with their tables: llama.cpp builds its graph again whenever a
    // batch's shape changes (a prompt, then generation; llama-server's slots), mostly one it has
    // built before, in the same memory. One built again the same takes its index and table from
    // here, not indexing and capturing it again (about 0.35 ms of a SmolLM2 step at DETAILED).
    struct kept_graph {
        graph_index                  index;
        std::shared_ptr<graph_table> table;
        uint64_t                     used = 0;  // when it was last the current graph (a tick of graph_gen)
    };

    static constexpr size_t GRAPHS_KEPT = 4;
    std::vector<kept_graph> graphs_kept;
    ggml_backend_sched_t    graphs_sched = nullptr;  // the scheduler `graph` and `graphs_kept` were built under

    // the node tables of this step's graphs, in order, to format after the step
    struct pending_table {
        std::shared_ptr<const graph_table> table;
        graph_head                         head;
    };

    std::vector<pending_table> tables;
    size_t                     n_tables = 0;

    // the node tables written in the current file: a graph built again the same (llama-server
    // rebuilds its graph on every step), or with other token or KV counts, names one of them
    // (`same_as`, `subst`); a new file starts over
    table_memory tables_written;
    uint64_t     tables_epoch = 0;
    int32_t      tables_file  = -1;

    uint64_t graph_gen = 0;  // bumped whenever `graph` indexes another graph

    // one op timer per backend of the scheduler (llama-instr-ops.h), made at its first compute
    struct timer_slot {
        std::unique_ptr<op_timer> timer;  // nullptr: this backend's ops are not timed
        bool                      armed = false;
    };

    ggml_backend_sched_t    timers_sched = nullptr;  // the scheduler `timers` were made for
    std::vector<timer_slot> timers;
    int32_t                 cpu_device    = -1;      // the CPU backend's device (layer spans elsewhere name theirs)
    bool                    async_devices = false;   // a GPU of the scheduler may still compute after a split returns

    capture_buffer           capture;                // llama_instr_capture (the CPU timer fills it)
    expert_log               experts;                // MoE routing (the CPU timer fills it)
    std::vector<std::string> capture_next;           // set under the session lock

    // ggml's scheduler profiler and its buffers (sized when a compute begins)
    ggml_backend_sched_profiler                   sched_prof = {};
    std::vector<ggml_backend_sched_profile_split> sched_splits;
    std::vector<ggml_backend_sched_profile_copy>  sched_copies;
    bool                                          sched_profiling = false;

    // the records of the current step
    std::vector<op_rec>      p_ops;
    std::vector<layer_rec>   p_layers;
    std::vector<busy_rec>    p_busy;
    std::vector<clock_rec>   p_clocks;
    std::vector<int64_t>     p_threads;
    std::vector<stat_row>    p_stats;
    std::vector<split_rec>   p_splits;
    std::vector<copy_rec>    p_copies;
    std::vector<remote_rec>  p_remote;
    std::vector<compute_rec> p_computes;

    // a step whose computes ended without a synchronization (op_timer::needs_sync): its records
    // and its step_end (`pending_end`, formatted at llama_decode's return) are written once the
    // host synchronizes the context (llama_instr_synchronized, or the next step's start)
    bool                     device_pending = false;  // the current step's computes are not synchronized yet
    bool                     step_pending   = false;  // a step waits for the synchronization to be written
    std::string              pending_end;
    std::vector<std::string> pending_lines;           // its records after the computes (RPC commands)

    // the current step
    bool    in_decode       = false;
    int64_t step            = -1;
    int32_t ubatch          = 0;
    int32_t n_tokens        = 0;  // of the current compute
    int32_t ubatch_tokens   = 0;  // of the ubatch whose graph computes next (0: a K-shift, say)
    int64_t t_compute_begin = 0;  // host time at llama_instr_compute_begin

    // llama.cpp's count of graphs reused (perf_get_data().n_reused) and the level changes at the
    // last compute this state saw (-1: none, or one went unseen since)
    int32_t  reused_seen   = -1;
    uint64_t level_changes = 0;

    std::vector<int32_t> scratch_ids;
    std::string          line;  // reused formatting buffer

    // what the host did since the last step: sampling, the program's own work (llama-instr-sampling.cpp)
    host_window between;

    // the medium whose embeddings the context's next steps decode (llama_instr_set_media, on the
    // decoding thread), and the current step's (0: none)
    int64_t media_next = 0, media = 0;
    int32_t media_slice_next = 0, media_slice = 0;

    // an encoder of tools/mtmd in place of a llama_context (its steps are its encodes), else nullptr
    std::unique_ptr<encoder_info> encoder;
};

// The state of ctx, created on first use; nullptr only when out of memory.
ctx_state * ctx_get(const llama_context * ctx) noexcept;

// The state of ctx if it has one (never made here: ctx may be a context freed since a caller saw
// it), else nullptr.
ctx_state * ctx_find(const llama_context * ctx) noexcept;

// At the start of a step: join the open session if st is not in it yet (new id; the current
// graph is announced again), and count the step. False when no session is open.
bool ctx_join(ctx_state & st, int32_t n_tokens, bool prompt);

// A new graph id in st's session.
int32_t next_graph_id(const ctx_state & st);

// At the end of a step (also one whose records failed): the step is no longer open; between steps,
// a new file that is due is started.
void step_done(ctx_state & st) noexcept;

// A step that ended but whose records wait for its context's synchronization: still open (its
// records go to the file it began in), but no other step's rotation waits for it.
void step_deferred(ctx_state & st) noexcept;

// "minimal", "detailed", "verbose" (or "off")
const char * level_name(int32_t level);

// Count a graph compute in st's session, and the op timings it lost (counted in totals.lost).
void count_compute(const ctx_state & st, int64_t n_lost, int64_t n_computes = 1);

// Append one complete record (no newline) made in session `epoch`. Records of a session that has
// ended since are dropped; after a write error, records are counted as lost.
void emit(uint64_t epoch, const std::string & line);

// A hook failed (out of memory, ...): the session's log is incomplete; session_end reports it.
// `hook` is a string literal. Never allocates, never throws.
void hook_failed(uint64_t epoch, const char * hook) noexcept;

}  // namespace llama_instr
