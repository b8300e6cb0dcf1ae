#pragma once

#include "ggml-backend.h"
#include "ggml-gpu-marks-instr.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device timing for the Vulkan backend (llamacpp-instr), reached through the registry's proc
// addresses "ggml_backend_vk_set_profiler", "ggml_backend_vk_profiler_collect" and
// "ggml_backend_vk_clock_pair", of the shape the GPU backends share (ggml-gpu-marks-instr.h).
// Declared here, not in ggml-vulkan.h, so that llama.cpp's own headers stay as they are.
//
// While a profiler is set on a Vulkan backend, its graph computes write timestamp queries (marks)
// into the compute command buffers they record anyway: when a buffer begins, before the first op
// recorded into it, after each op that `want` selects (every op without it) and when the buffer
// ends, in recording order. A timestamp waits for the commands before it, so the time between two
// marks of a buffer is the work recorded between them. Nothing else changes: no extra submit or
// barrier, and fusion and submission are as without it. Once the backend is synchronized, collect
// reads each mark's device time. Buffers are owned and sized by the caller; nothing is allocated
// while computing.
enum ggml_vk_profile_mark_kind {
    GGML_VK_PROFILE_CMDBUF_BEGIN = 0,  // a command buffer begins (before its first command)
    GGML_VK_PROFILE_OPS_BEGIN    = 1,  // before the buffer's first op (after any copies recorded first)
    GGML_VK_PROFILE_OP           = 2,  // after an op's commands
    GGML_VK_PROFILE_CMDBUF_END   = 3,  // a command buffer ends (after its last command)
    GGML_VK_PROFILE_READ         = 4,  // after a read's copy (see `read`): from the mark before, its time
};

struct ggml_vk_profile_mark {
    const struct ggml_tensor * node;     // OP: the op's first node; CMDBUF_END: the buffer's last op's, or NULL
    int32_t                    n_fused;  // nodes fused into it (they follow it in the computed graph)
    int32_t                    kind;     // enum ggml_vk_profile_mark_kind
    int32_t                    n_ops;    // ops recorded since the previous mark (this one's included)
    int32_t                    cmdbuf;   // command buffer, counted from 0 since the profiler was set
    int32_t                    valid;    // set by collect: 1 = t holds the time
    uint64_t                   t;        // set by collect: device ticks (see ggml_vk_profiler)
};

// A read of an op's output without a wait (see struct ggml_vk_profiler's `read`).
struct ggml_vk_profile_read {
    const struct ggml_tensor * tensor;      // what was read
    size_t                     offset;      // where its bytes are in `readback`
    size_t                     row_bytes;   // bytes of each row, from its start
    size_t                     row_stride;  // bytes from one row to the next, there as in the tensor (nb[1])
    int32_t                    n_rows;      // its rows (ne[1])
    int32_t                    mark;        // its READ mark: the read ran if that mark is valid
};

struct ggml_vk_profiler {
    struct ggml_vk_profile_mark * marks;    // [cap]
    int32_t                       cap;
    int32_t                       n_marks;  // marks written so far (appended across graph computes)
    int32_t                       n_lost;   // marks not written: the buffer was full
    // optional: mark op (first .. last node) only if it returns true; NULL = every op. The last
    // op of a graph compute and of each command buffer is always marked.
    bool (*want)(void * user, const struct ggml_tensor * first, const struct ggml_tensor * last);
    void *  user;
    // set by ggml_backend_vk_set_profiler: ns per tick and the valid bits of a timestamp
    double  period_ns;
    int32_t valid_bits;
    // optional: read an op's output back with the commands recorded anyway. After an op (its
    // nodes[0 .. n_nodes): the node and those fused into it), if `read` returns one of this
    // backend's tensors (a matrix: ne[2] = ne[3] = 1), the block from its first row's start to the
    // end of its last row's first row_bytes is copied into a host-visible buffer by one copy
    // command in the same command buffer, behind the next barrier ggml-vulkan records anyway
    // (before a node that depends on unsynchronized writes; at the end of the command buffer if
    // none comes first, one of its own), and a READ mark after it times it. No submit, no wait,
    // and no barrier that ggml-vulkan would not record: a later write of the memory read waits for
    // the copy as for any read. Once the backend is synchronized, collect copies what ran into
    // `readback` (reads[k].offset). Owned and sized by the caller.
    const struct ggml_tensor * (*read)(void *                       user,
                                       struct ggml_tensor * const * nodes,
                                       int32_t                      n_nodes,
                                       size_t *                     row_bytes);
    struct ggml_vk_profile_read * reads;         // [reads_cap]
    int32_t                       reads_cap;
    int32_t                       n_reads;       // reads recorded (appended across graph computes)
    int32_t                       n_reads_lost;  // reads not recorded: no room left
    uint8_t *                     readback;      // [readback_cap]
    size_t                        readback_cap;
    size_t                        readback_used;
};

// Set (or with NULL, unset) the profiler; setting it starts it afresh (n_marks = 0). -1: the
// device cannot write timestamps from its compute queue (nothing is set).
typedef int (*ggml_backend_vk_set_profiler_t)(ggml_backend_t backend, struct ggml_vk_profiler * profiler);
// After the backend was synchronized: the device time of each mark in [begin, end), and the bytes
// of the reads whose READ mark is among them. 0 = ok, -1 = the query failed.
typedef int (*ggml_backend_vk_profiler_collect_t)(ggml_backend_t            backend,
                                                  struct ggml_vk_profiler * profiler,
                                                  int32_t                   begin,
                                                  int32_t                   end);

// The clock pair (ggml_backend_gpu_clock_pair_t): the device's timestamp ticks and the host's
// clock, by GGML_GPU_CLOCK_CALIBRATED (VK_EXT_calibrated_timestamps, with the driver's
// maxDeviation) where the device has it with CLOCK_MONOTONIC, else GGML_GPU_CLOCK_FENCE.

#ifdef __cplusplus
}
#endif
