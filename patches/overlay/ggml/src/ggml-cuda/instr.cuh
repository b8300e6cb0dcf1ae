#pragma once

// llamacpp-instr device timing (ggml-cuda-instr.h): marks launched before the ops of a graph
// compute, captured into the CUDA graph when one is captured, and around copies between the host
// and the device. Every hook is called only while a profiler is set (ggml_cuda_instr_on).

#include "common.cuh"
#include "ggml-cuda-instr.h"

static inline bool ggml_cuda_instr_on(const ggml_backend_cuda_context * ctx) {
    return ctx->instr_prof != nullptr;
}

// the key of the CUDA graph to use for `key` while a profiler is set: one per selection, apart
// from the backend's own graphs (key itself, with no profiler set)
const void * ggml_cuda_instr_graph_key(const ggml_backend_cuda_context * ctx, const void * key);

// before a graph compute (and before a capture begins): `capture` is the CUDA graph about to be
// captured, or null when the compute runs uncaptured or replays a graph
void ggml_cuda_instr_compute_begin(ggml_backend_cuda_context * ctx,
                                   ggml_cuda_graph *           capture,
                                   const ggml_cgraph *         cgraph);

// before node i of cgraph is computed (an op; nodes fused into it follow it)
void ggml_cuda_instr_op(ggml_backend_cuda_context * ctx, const ggml_cgraph * cgraph, int i);

// the op begun last fused n_fused more nodes
void ggml_cuda_instr_fused(ggml_backend_cuda_context * ctx, int n_fused);

// a mark of `kind` (GRAPH_END, JOIN) on stream `stream_no`
void ggml_cuda_instr_mark(ggml_backend_cuda_context * ctx, int kind, int stream_no);

// the main stream forks side streams (a concurrent region of GGML_CUDA_GRAPH_OPT), after the op
// before the region: when every op is marked, a FORK mark ends that op's interval there
void ggml_cuda_instr_fork(ggml_backend_cuda_context * ctx);

// after a graph compute: `replayed` is the CUDA graph launched (its marks are appended now, its
// times copied back after it), or null when the compute ran uncaptured
void ggml_cuda_instr_compute_end(ggml_backend_cuda_context * ctx,
                                 ggml_cuda_graph *           replayed,
                                 const ggml_cgraph *         cgraph);

// the context whose profiler the calling thread set for `device`, or null: a buffer's copies run
// on the thread's own stream
ggml_backend_cuda_context * ggml_cuda_instr_thread(int device);

// a copy's mark (COPY_BEGIN, COPY_END) on `stream`
void ggml_cuda_instr_copy(ggml_backend_cuda_context * ctx,
                          cudaStream_t                stream,
                          int                         stream_no,
                          int                         kind,
                          const ggml_tensor *         tensor,
                          size_t                      bytes,
                          int                         flags);

// the proc addresses (ggml-cuda-instr.h)
int ggml_backend_cuda_set_profiler(ggml_backend_t backend, ggml_cuda_profiler * profiler);
int ggml_backend_cuda_profiler_collect(ggml_backend_t       backend,
                                       ggml_cuda_profiler * profiler,
                                       int32_t              begin,
                                       int32_t              end);
int ggml_backend_cuda_clock_pair(ggml_backend_t backend,
                                 int32_t        method,
                                 int64_t (*now)(void),
                                 ggml_gpu_clock_pair * pair);
