#pragma once

#include "ggml-backend.h"
#include "ggml-gpu-marks-instr.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device timing for the CUDA backend (llamacpp-instr), reached through the registry's proc
// addresses "ggml_backend_cuda_set_profiler", "ggml_backend_cuda_profiler_collect" and
// "ggml_backend_cuda_clock_pair", of the shape the GPU backends share (ggml-gpu-marks-instr.h).
// Declared here, not in ggml-cuda.h, so that llama.cpp's own headers stay as they are.
//
// While a profiler is set on a CUDA backend, each mark launches a one-thread kernel that writes
// the device's %globaltimer (ns) when it runs: before each op that `want` selects, after each
// graph compute's last op (then a CALIB mark), where the main stream forks side streams and where
// a side stream joins it, and around each copy between the host and the device (the backend's
// asynchronous copies; its buffers' synchronous ones when `sync_copies`). A kernel on a stream runs after the work queued before
// it, so the time from one mark to the next on the same stream is the work launched between
// them; marks are launched as ggml's kernels are (programmatic dependent launch where the GPU
// has it), so ggml's kernels keep overlapping their launches across a mark. With CUDA
// graphs on, the marks are captured into the graph with the ops and run at every replay: the
// graphs captured with marks are kept apart from the backend's own, one set per `selection`, so
// that unsetting the profiler replays the graphs without marks and nothing is captured twice.
// Nothing else changes: no event, no synchronization, no graph disabled. Once the backend is
// synchronized, collect reads each mark's time. Buffers are owned and sized by the caller; nothing
// is allocated per node.
enum ggml_cuda_profile_mark_kind {
    GGML_CUDA_PROFILE_OP         = 0,  // before an op (its first node; nodes fused into it follow)
    GGML_CUDA_PROFILE_GRAPH_END  = 1,  // after a graph compute's last op (on the main stream)
    GGML_CUDA_PROFILE_JOIN       = 2,  // a side stream's last op is done (it joins the main stream)
    GGML_CUDA_PROFILE_COPY_BEGIN = 3,  // before a copy between the host and the device
    GGML_CUDA_PROFILE_COPY_END   = 4,  // after it
    GGML_CUDA_PROFILE_CALIB      = 5,  // just after a graph compute's GRAPH_END mark, nothing between:
                                       // the two marks' interval is what a mark itself takes there
    GGML_CUDA_PROFILE_FORK       = 6,  // the main stream forks side streams (GGML_CUDA_GRAPH_OPT), after
                                       // the op before them: it ends that op, which would otherwise run
                                       // on to the join (the main stream runs nothing in between); laid
                                       // when every op is marked (want NULL)
};

enum ggml_cuda_profile_mark_flags {
    GGML_CUDA_PROFILE_CAPTURED         = 1,  // run by a CUDA graph's replay (captured at an earlier compute)
    GGML_CUDA_PROFILE_HOST_TO_DEVICE   = 2,  // COPY_*: the copy's direction
    GGML_CUDA_PROFILE_DEVICE_TO_HOST   = 4,
    GGML_CUDA_PROFILE_DEVICE_TO_DEVICE = 8,
};

// the stream of copies a buffer makes synchronously (cudaStreamPerThread of the calling thread)
#define GGML_CUDA_PROFILE_THREAD_STREAM (-1)

struct ggml_cuda_profile_mark {
    const struct ggml_tensor * node;     // OP: the op's first node; COPY_*: the tensor copied into or out of the device
    int64_t                    bytes;    // COPY_*: bytes copied
    int32_t                    kind;     // enum ggml_cuda_profile_mark_kind
    int32_t                    n_fused;  // OP: nodes fused into it (they follow it in the computed graph)
    int32_t                    n_ops;    // ops launched on its stream after it, before the stream's next mark
    int32_t                    stream;   // 0: the main stream, 1..: a side stream, GGML_CUDA_PROFILE_THREAD_STREAM
    int32_t  graph;  // the graph compute it is of, counted from 0 since the profiler was set; -1: none
    int32_t  flags;  // enum ggml_cuda_profile_mark_flags
    int32_t  valid;  // set by collect: 1 = t holds the time
    uint64_t t;      // set by collect: %globaltimer (ns) when the mark ran
};

struct ggml_cuda_profiler {
    struct ggml_cuda_profile_mark * marks;     // [cap]
    int32_t                         cap;
    int32_t                         n_marks;   // marks appended so far (across graph computes and copies)
    int32_t                         n_lost;    // marks not appended: no room left
    int32_t                         n_graphs;  // graph computes since it was set
    // which ops are marked: an op is if `want` (NULL: every op) returns true for it, given the
    // previous op of its graph compute (NULL for the first); the first op of a graph compute is
    // marked always. `selection` (1..15) names the choice: CUDA graphs are captured once per
    // selection and replayed with its marks, so a caller gives each `want` its own.
    bool (*want)(void * user, const struct ggml_tensor * prev, const struct ggml_tensor * node);
    void *  user;
    int32_t selection;
    // also mark the copies the backend's buffers make synchronously (the host waits on each, so
    // its own times bound them; two marks cost a few us of the host's time per copy)
    int32_t sync_copies;
};

// Set (or with NULL, unset) the profiler, on the calling thread (the copies the backend's buffers
// make run on it). Its marks are appended at n_marks. A cap larger than the room the backend has
// for marks' times waits for the backend's streams and grows the room. 0 = ok, -1 = the profiler
// is refused (a selection outside 1..15, no memory for the marks' times, a non-CUDA build).
typedef int (*ggml_backend_cuda_set_profiler_t)(ggml_backend_t backend, struct ggml_cuda_profiler * profiler);

// After the backend was synchronized: the time of each mark in [begin, end). 0 = ok, -1 = no
// profiler's times are held.
typedef int (*ggml_backend_cuda_profiler_collect_t)(ggml_backend_t              backend,
                                                    struct ggml_cuda_profiler * profiler,
                                                    int32_t                     begin,
                                                    int32_t                     end);

// The clock pair (ggml_backend_gpu_clock_pair_t): the device's %globaltimer (ns) and the host's
// clock at the same instant, by GGML_GPU_CLOCK_KERNEL: a one-thread kernel on a stream of its own
// answers the host through mapped host memory, the best of a few round trips; `resolution_ns` is
// the timer's step as the kernel saw it. The kernel must find a free multiprocessor within 50 ms.

#ifdef __cplusplus
}
#endif
