#pragma once

// llamacpp-instr: the op-timer seam. Each backend times its own ops with its own profiler, set
// through its registry's proc address (the CPU backend's in patch 0001); on our side one op timer
// per backend kind arms that profiler before a graph compute and, after the scheduler has
// synchronized the backends, turns what it measured into the step's records:
//
//   llama-instr-ops-cpu.cpp     "CPU"     ggml_backend_cpu_set_profiler: every op on the host clock
//   llama-instr-ops-rpc.cpp     "RPC"     a patched RPC server's own op times (ggml_rpc_profiler),
//                                          placed on the host clock from the client's send and receive
//   llama-instr-ops-vulkan.cpp  "Vulkan"  ggml_backend_vk_set_profiler: timestamp queries in the
//                                          command buffers, put on the host clock by a clock pair
//   llama-instr-ops-cuda.cpp    "CUDA"    ggml_backend_cuda_set_profiler: %globaltimer marks captured
//                                          into the CUDA graphs, put on the host clock by a clock pair
//
// A timer puts every interval on the host clock (now_ns()) before it appends it, so the records
// do not care which backend timed an op. Timers are made once per backend of a context's scheduler
// (make_op_timer) and live with the context; arm and collect only grow buffers they already have.

#include "ggml-backend.h"
#include "ggml-cuda-instr.h"

struct llama_context;

#include <cstdint>
#include <memory>
#include <vector>

namespace llama_instr {

struct ctx_state;
struct compute_rec;

class op_timer {
  public:
    op_timer(ggml_backend_t backend, int32_t device) : backend(backend), device(device) {}

    virtual ~op_timer() = default;

    // Before ctx computes gf (whose node table is st.graph): hand the backend its profiler, with
    // room for every node of gf. Returns whether it is armed. May throw (std::bad_alloc): the
    // caller then disarms every timer.
    virtual bool arm(ctx_state & st, const llama_context * ctx, const ggml_cgraph * gf) = 0;

    // Take the profiler off the backend. Never throws. Called once the scheduler synchronized the
    // backends, before collect, or instead of it when something failed.
    virtual void disarm() noexcept = 0;

    // Whether collect needs the backend synchronized after the compute. A timer that needs no
    // sync (the CPU's: its backend computes before it returns; CUDA's: it reads what it measured
    // in finish) lets the compute end without one when no other timer needs it, and the step's
    // records then wait for the host's own next synchronization (llama_instr_synchronized).
    virtual bool needs_sync() const { return true; }

    // Whether it reads what it measured only in finish, after a synchronization (CUDA's marks).
    virtual bool reads_later() const { return false; }

    // After disarm: append what the backend measured in this compute to the step's records, on the
    // host clock: ops to st.p_ops (op_rec::device = device), their layer spans to st.p_layers
    // (append_layer_spans), and anything timer-specific; widen [c.t_start, c.t_end] to cover them.
    // Returns the ops measured but not kept (no room, or not a node of the graph indexed), counted
    // as lost. Only after an arm that returned true. May throw.
    virtual int64_t collect(ctx_state & st, compute_rec & c) = 0;

    // At the end of the step, before its records are written, for each of its computes in order,
    // once the backends were synchronized after them: append what the backend could only report
    // later (an RPC server's times come with a reply the step reads after its computes; a CUDA
    // device's marks are read once the host synchronized), as collect does, to the compute's late
    // ranges (compute_rec::late_op_begin.., set by the caller around the call). Returns the ops
    // lost. May throw. The default has nothing late.
    virtual int64_t finish(ctx_state & st, compute_rec & c) {
        (void) st;
        (void) c;
        return 0;
    }

    const ggml_backend_t backend;
    const int32_t        device;  // index into session_start.machine.devices
};

// The timer of backend (a backend of the scheduler), or nullptr when there is none: no timer for
// its kind, or a backend built without the profiler entry point (a stock library).
std::unique_ptr<op_timer> make_op_timer(ggml_backend_t backend);

// The timers, by the backend registry's name.
std::unique_ptr<op_timer> make_cpu_op_timer(ggml_backend_t backend, ggml_backend_reg_t reg, int32_t device);
std::unique_ptr<op_timer> make_rpc_op_timer(ggml_backend_t backend, ggml_backend_reg_t reg, int32_t device);
std::unique_ptr<op_timer> make_vk_op_timer(ggml_backend_t backend, ggml_backend_reg_t reg, int32_t device);
std::unique_ptr<op_timer> make_cuda_op_timer(ggml_backend_t backend, ggml_backend_reg_t reg, int32_t device);

// CUDA's timer on the profiler's entry points as given (make_cuda_op_timer finds them in the
// backend's registry; the native tests hand in their own, with no device); nullptr if one is null.
std::unique_ptr<op_timer> make_cuda_op_timer_from(ggml_backend_t                       backend,
                                                  int32_t                              device,
                                                  ggml_backend_cuda_set_profiler_t     set_profiler,
                                                  ggml_backend_cuda_profiler_collect_t collect_marks,
                                                  ggml_backend_gpu_clock_pair_t        clock_pair);

// index of backend's device in ggml's registry (as session_start.machine.devices lists them), or -1
int32_t device_index(ggml_backend_t backend);

// The node index (in st.graph) of the k-th op a timer measured, cached: a graph runs the same
// sequence every step. The cache empties itself when the context indexes another graph.
class node_map {
  public:
    // -1 if t is not a node of the graph indexed
    int32_t find(ctx_state & st, size_t k, const ggml_tensor * t);

  private:
    uint64_t                         gen = 0;  // ctx_state::graph_gen the entries are of
    std::vector<const ggml_tensor *> ptr;
    std::vector<int32_t>             idx;
};

// Layer spans of st.p_ops[op_begin, op_end) (one timer's ops, in execution order): the first start
// to the last end of each run of ops of one layer, appended to st.p_layers.
void append_layer_spans(ctx_state & st, size_t op_begin, size_t op_end);

}  // namespace llama_instr
