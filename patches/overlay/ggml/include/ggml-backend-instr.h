#pragma once

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// llamacpp-instr's additions to ggml-backend, declared here, not in ggml-backend.h, so that
// llama.cpp's own headers stay as they are (and a build of the pin shares the compiled objects of
// every file that includes them).

// What the scheduler did in each graph compute. While a profiler is set, every compute appends one
// entry per split it ran and one per input it copied to another backend. Buffers are owned and
// sized by the caller; nothing is allocated while computing. Times are ns, CLOCK_MONOTONIC, taken
// on the host.
struct ggml_backend_sched_profile_split {
    int32_t backend_id;  // index of the split's backend in the scheduler
    int32_t i_start;     // its nodes: [i_start, i_end) of the computed graph
    int32_t i_end;
    int32_t n_inputs;
    int64_t t_start;   // before its inputs were copied
    int64_t t_launch;  // when its graph was handed to the backend
    int64_t t_end;     // when the backend returned it (an asynchronous backend may still be running it)
};

struct ggml_backend_sched_profile_copy {
    const struct ggml_tensor * tensor;  // the tensor copied (the original, not its copy)
    int32_t                    split;   // the split it was copied for (an index into this compute's splits)
    int32_t                    from_backend_id;
    int32_t                    to_backend_id;
    int64_t                    bytes;
    int64_t                    t_start;  // the copy call, on the host (a synchronous copy: the transfer)
    int64_t                    t_end;
};

struct ggml_backend_sched_profiler {
    struct ggml_backend_sched_profile_split * splits;    // [cap_splits]
    int32_t                                   cap_splits;
    int32_t                                   n_splits;  // entries appended; past cap_splits, counted only
    struct ggml_backend_sched_profile_copy *  copies;    // [cap_copies]
    int32_t                                   cap_copies;
    int32_t                                   n_copies;
};

// NULL = off (the default)
GGML_API void ggml_backend_sched_set_profiler(ggml_backend_sched_t                 sched,
                                              struct ggml_backend_sched_profiler * profiler);

// An observer of backend buffers: every buffer made and freed, every allocation that fails, and
// each device's memory as reported. may_alloc returning false makes the allocation fail as if the
// device were out of memory (a memory budget); get_memory may lower what a device reports. Called
// on the thread that allocates; it must not allocate buffers. A buffer type may make its buffers
// through another one: may_alloc, on_alloc_failed and alloc_done see the outermost allocation only
// (asked once, told once of its failure), and alloc_done follows every may_alloc, once the
// allocation has its buffer or has failed; on_alloc sees every buffer made (buffers from host
// memory included, and their may_alloc). NULL = none (the default): one branch per buffer made,
// freed or allocated, and per query.
struct ggml_backend_buffer_observer {
    void (*on_alloc)(ggml_backend_buffer_t buffer);
    void (*on_free)(ggml_backend_buffer_t buffer);
    bool (*may_alloc)(ggml_backend_buffer_type_t buft, size_t size);
    void (*on_alloc_failed)(ggml_backend_buffer_type_t buft, size_t size, bool by_budget);
    void (*get_memory)(ggml_backend_dev_t device, size_t * free, size_t * total);
    void (*alloc_done)(void);
};

GGML_API void ggml_backend_set_buffer_observer(const struct ggml_backend_buffer_observer * observer);

#ifdef __cplusplus
}
#endif
