#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// Per-node execution timing (llamacpp-instr). While set on a CPU backend, every graph compute
// appends one entry per executed op, timed on thread 0 from the barrier that ended the previous
// op to the barrier after this one. Buffers are owned and sized by the caller; nothing is
// allocated while computing. Declared here, not in ggml-cpu.h, so that llama.cpp's own headers
// stay as they are (and a build of the pin shares the compiled objects of every file that
// includes them).
struct ggml_cpu_profile_op {
    const struct ggml_tensor * node;      // the op's (first) node
    int32_t                    node_idx;  // its index in the computed graph
    int32_t                    n_fused;   // nodes fused into it (they follow it in the graph)
    int64_t                    t_start;   // ns, CLOCK_MONOTONIC
    int64_t                    t_end;
};

struct ggml_cpu_profiler {
    struct ggml_cpu_profile_op * ops;         // [cap]
    int32_t                      cap;
    int32_t                      n_ops;       // entries filled so far (appended across splits)
    int64_t *                    thread_end;  // optional [cap * max_threads]: when each thread finished op k
    int32_t                      max_threads;
    int32_t                      n_threads;   // threads used by the last compute
    int64_t                      t_start;     // first compute start (0 = not started)
    int64_t                      t_end;       // last compute end
    // optional (value statistics): called on every thread once op k is complete, for the op's
    // last node; threads share the work by (ith, nth). They meet at an extra barrier only when
    // the next op writes where this op's output is (an in-place op), so the output is read intact.
    void (*on_node)(void * user, int32_t k, const struct ggml_tensor * node, int ith, int nth);
    void *  user;
    // with on_node: call it only for ops whose last node has this op (GGML_OP_NONE: every op),
    // so that no other op pays for it (nor waits at its extra barrier)
    int32_t on_node_op;
};

// Set through the CPU registry's proc address "ggml_backend_cpu_set_profiler" (NULL = off).
typedef void (*ggml_backend_cpu_set_profiler_t)(ggml_backend_t backend_cpu, struct ggml_cpu_profiler * profiler);

// The clock of the profiler's times (ns), also reached through the registry's proc address
// "ggml_cpu_profiler_now", so that a caller's own timestamps are on the very same clock.
GGML_BACKEND_API int64_t ggml_cpu_profiler_now(void);
typedef int64_t (*ggml_cpu_profiler_now_t)(void);

// ggml_graph_compute, each op timed into profiler (NULL: as ggml_graph_compute)
GGML_BACKEND_API enum ggml_status ggml_graph_compute_profiled(struct ggml_cgraph *       cgraph,
                                                              struct ggml_cplan *        cplan,
                                                              struct ggml_cpu_profiler * profiler);

#ifdef __cplusplus
}
#endif
