#include "ggml-backend-impl.h"
#include "instr.cuh"

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

// llamacpp-instr device timing. A mark is a one-thread kernel writing %globaltimer into a slot:
// launched plainly, into the mark's slot of mapped host memory (read once the backend is
// synchronized); captured into a CUDA graph, into the graph's own device slots, copied to the
// host slots after each launch of the graph (one copy per launch). A captured graph keeps its
// marks' description (node by index, kind, stream), appended to the profiler at each launch.

// a mark as captured into a CUDA graph
struct ggml_cuda_instr_graph_mark {
    int32_t node_idx;  // index in the computed graph, or -1
    int32_t kind;
    int32_t n_fused;
    int32_t n_ops;
    int32_t stream;
};

struct ggml_cuda_instr_graph {
    uint64_t *                              stamps = nullptr;  // device memory [cap]
    int32_t                                 cap    = 0;
    std::vector<ggml_cuda_instr_graph_mark> marks;
    int32_t                                 n_lost = 0;  // marks not captured: no room
};

struct ggml_cuda_instr {
    ggml_cuda_profiler * p = nullptr;

    uint64_t * host     = nullptr;  // pinned, mapped [host_cap]: each mark's time
    uint64_t * host_dev = nullptr;  // the same memory, as the device writes it
    int32_t    host_cap = 0;

    // the graph compute being launched
    ggml_cuda_instr_graph * capturing = nullptr;          // its marks go into this CUDA graph, else plain
    int32_t                 graph     = -1;
    const ggml_tensor *     prev      = nullptr;          // the previous op's node
    int32_t                 last[GGML_CUDA_MAX_STREAMS];  // each stream's last mark, or -1
    int32_t                 cur = -1;                     // the mark of the op begun last, or -1

    // the clock pair: a stream of its own, and mapped host memory the kernel answers through
    cudaStream_t        clock_stream = nullptr;
    void *              clock_mem    = nullptr;  // the flag, then the kernel's answers
    volatile uint32_t * clock_flag   = nullptr;
    volatile uint64_t * clock_out    = nullptr;
};

void ggml_cuda_instr_graph_free(ggml_cuda_instr_graph * g) {
    if (g) {
        if (g->stamps) {
            CUDA_CHECK(cudaFree(g->stamps));
        }
        delete g;
    }
}

void ggml_cuda_instr_free(ggml_cuda_instr * s) {
    if (s) {
        if (s->host) {
            CUDA_CHECK(cudaFreeHost(s->host));
        }
        if (s->clock_mem) {
            CUDA_CHECK(cudaFreeHost(s->clock_mem));
        }
        if (s->clock_stream) {
            CUDA_CHECK(cudaStreamDestroy(s->clock_stream));
        }
        delete s;
    }
}

static __device__ __forceinline__ uint64_t ggml_cuda_instr_globaltimer() {
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return 0;  // (not offered there: no proc address)
#endif
}

// launched as ggml launches its own kernels (with programmatic dependent launch where the GPU has
// it): it waits for the work before it to complete, stamps, and lets the work after it start, so
// that ggml's kernels keep overlapping their launches across a mark
static __global__ void ggml_cuda_instr_stamp(uint64_t * slot) {
    ggml_cuda_pdl_sync();
    *slot = ggml_cuda_instr_globaltimer();
    ggml_cuda_pdl_lc();
}

static void ggml_cuda_instr_launch_stamp(cudaStream_t stream, uint64_t * slot) {
    ggml_cuda_kernel_launch(ggml_cuda_instr_stamp, ggml_cuda_kernel_launch_params(dim3(1), dim3(1), (size_t) 0, stream),
                            slot);
}

const void * ggml_cuda_instr_graph_key(const ggml_backend_cuda_context * ctx, const void * key) {
    if (!ctx->instr_prof) {
        return key;
    }
    // tensors are far more than 15 bytes apart: the key with the selection in its low bits is
    // no other graph's key
    return (const void *) ((uintptr_t) key ^ (uintptr_t) ctx->instr_prof->selection);
}

static ggml_cuda_instr_graph_mark * ggml_cuda_instr_graph_at(ggml_cuda_instr * s, int32_t k) {
    return k >= 0 && k < (int32_t) s->capturing->marks.size() ? &s->capturing->marks[k] : nullptr;
}

// append a mark on stream_no (launched on `stream`); returns its index (in the profiler, or in
// the graph being captured), or -1 when there was no room
static int32_t ggml_cuda_instr_append(ggml_cuda_instr *   s,
                                      cudaStream_t        stream,
                                      int                 stream_no,
                                      int                 kind,
                                      const ggml_cgraph * cgraph,
                                      int                 node_idx,
                                      const ggml_tensor * node,
                                      int64_t             bytes,
                                      int                 flags) {
    ggml_cuda_profiler * p = s->p;
    if (s->capturing) {
        ggml_cuda_instr_graph * g = s->capturing;
        const int32_t           k = (int32_t) g->marks.size();
        if (k >= g->cap) {
            g->n_lost++;
            return -1;
        }
        g->marks.push_back({ node_idx, kind, 0, 0, stream_no });  // reserved: no allocation
        ggml_cuda_instr_launch_stamp(stream, g->stamps + k);
        return k;
    }
    const int32_t k = p->n_marks;
    if (k >= p->cap || k >= s->host_cap) {
        p->n_lost++;
        return -1;
    }
    ggml_cuda_profile_mark & m = p->marks[k];
    m                          = {};
    m.node                     = node ? node : (cgraph && node_idx >= 0 ? cgraph->nodes[node_idx] : nullptr);
    m.bytes                    = bytes;
    m.kind                     = kind;
    m.stream                   = stream_no;
    m.graph    = kind == GGML_CUDA_PROFILE_COPY_BEGIN || kind == GGML_CUDA_PROFILE_COPY_END ? -1 : s->graph;
    m.flags    = flags;
    s->host[k] = 0;  // not run (yet)
    p->n_marks++;
    ggml_cuda_instr_launch_stamp(stream, s->host_dev + k);
    return k;
}

static void ggml_cuda_instr_count_op(ggml_cuda_instr * s, int stream_no, int32_t k) {
    if (k < 0) {
        return;
    }
    if (s->capturing) {
        if (ggml_cuda_instr_graph_mark * m = ggml_cuda_instr_graph_at(s, k)) {
            m->n_ops++;
        }
    } else if (k < s->p->n_marks) {
        s->p->marks[k].n_ops++;
    }
    GGML_UNUSED(stream_no);
}

void ggml_cuda_instr_compute_begin(ggml_backend_cuda_context * ctx,
                                   ggml_cuda_graph *           capture,
                                   const ggml_cgraph *         cgraph) {
    ggml_cuda_instr * s = ctx->instr;
    s->graph            = s->p->n_graphs++;
    s->prev             = nullptr;
    s->cur              = -1;
    for (int32_t & k : s->last) {
        k = -1;
    }
    s->capturing = nullptr;
#ifdef USE_CUDA_GRAPH
    if (capture) {
        // room for a mark per node, one more per node for a fork or a side stream's join (a
        // concurrent region has a node per stream it forks), and the graph's end and its
        // calibration; allocated before the capture begins
        if (!capture->instr) {
            capture->instr = new ggml_cuda_instr_graph;
        }
        ggml_cuda_instr_graph * g    = capture->instr;
        const int32_t           need = 2 * cgraph->n_nodes + 2 + GGML_CUDA_MAX_STREAMS;
        if (g->cap < need) {
            if (g->stamps) {
                CUDA_CHECK(cudaFree(g->stamps));
                g->stamps = nullptr;
            }
            ggml_cuda_set_device(ctx->device);
            CUDA_CHECK(cudaMalloc((void **) &g->stamps, need * sizeof(uint64_t)));
            g->cap = need;
        }
        g->marks.clear();
        g->marks.reserve(g->cap);
        g->n_lost    = 0;
        s->capturing = g;
    }
#else
    GGML_UNUSED(capture);
    GGML_UNUSED(cgraph);
#endif
}

void ggml_cuda_instr_op(ggml_backend_cuda_context * ctx, const ggml_cgraph * cgraph, int i) {
    ggml_cuda_instr *          s    = ctx->instr;
    const ggml_cuda_profiler * p    = s->p;
    const ggml_tensor *        node = cgraph->nodes[i];
    const int                  sn   = ctx->curr_stream_no;
    const bool                 want = !s->prev || !p->want || p->want(p->user, s->prev, node);
    s->prev                         = node;
    s->cur                          = -1;
    if (want) {
        s->cur = ggml_cuda_instr_append(s, ctx->stream(), sn, GGML_CUDA_PROFILE_OP, cgraph, i, nullptr, 0, 0);
        if (s->cur >= 0) {
            s->last[sn] = s->cur;
        }
    }
    // an op on a side stream with no mark of its own is of the main stream's open mark, whose
    // interval runs on through the concurrent region (MINIMAL: the layer's span)
    ggml_cuda_instr_count_op(s, sn, s->last[sn] >= 0 || sn == 0 ? s->last[sn] : s->last[0]);
}

void ggml_cuda_instr_fused(ggml_backend_cuda_context * ctx, int n_fused) {
    ggml_cuda_instr * s = ctx->instr;
    if (s->cur < 0) {
        return;
    }
    if (s->capturing) {
        if (ggml_cuda_instr_graph_mark * m = ggml_cuda_instr_graph_at(s, s->cur)) {
            m->n_fused = n_fused;
        }
    } else if (s->cur < s->p->n_marks) {
        s->p->marks[s->cur].n_fused = n_fused;
    }
}

void ggml_cuda_instr_mark(ggml_backend_cuda_context * ctx, int kind, int stream_no) {
    ggml_cuda_instr * s      = ctx->instr;
    cudaStream_t      stream = ctx->stream(ctx->device, stream_no);
    const int32_t     k      = ggml_cuda_instr_append(s, stream, stream_no, kind, nullptr, -1, nullptr, 0, 0);
    if (k >= 0) {
        s->last[stream_no] = -1;  // the ops after it are no mark's
    }
    if (kind == GGML_CUDA_PROFILE_GRAPH_END) {
        // what a mark takes in this compute, where the stream runs as it does between ops: a mark
        // right after the end mark
        ggml_cuda_instr_append(s, stream, stream_no, GGML_CUDA_PROFILE_CALIB, nullptr, -1, nullptr, 0, 0);
    }
}

void ggml_cuda_instr_fork(ggml_backend_cuda_context * ctx) {
    if (ctx->instr->p->want) {
        return;  // not every op is marked: the main stream's open mark stands for the region too
    }
    ggml_cuda_instr_mark(ctx, GGML_CUDA_PROFILE_FORK, 0);
}

void ggml_cuda_instr_compute_end(ggml_backend_cuda_context * ctx,
                                 ggml_cuda_graph *           replayed,
                                 const ggml_cgraph *         cgraph) {
    ggml_cuda_instr * s = ctx->instr;
    s->capturing        = nullptr;
#ifdef USE_CUDA_GRAPH
    const ggml_cuda_instr_graph * g = replayed ? replayed->instr : nullptr;
    if (!g) {
        return;
    }
    ggml_cuda_profiler * p    = s->p;
    const int32_t        base = p->n_marks;
    const int32_t        room = std::max(0, std::min(p->cap, s->host_cap) - base);
    const int32_t        n    = std::min((int32_t) g->marks.size(), room);
    p->n_lost += (int32_t) g->marks.size() - n + g->n_lost;
    for (int32_t j = 0; j < n; j++) {
        const ggml_cuda_instr_graph_mark & d = g->marks[j];
        ggml_cuda_profile_mark &           m = p->marks[base + j];
        m                                    = {};
        m.node            = d.node_idx >= 0 && d.node_idx < cgraph->n_nodes ? cgraph->nodes[d.node_idx] : nullptr;
        m.kind            = d.kind;
        m.n_fused         = d.n_fused;
        m.n_ops           = d.n_ops;
        m.stream          = d.stream;
        m.graph           = s->graph;
        m.flags           = GGML_CUDA_PROFILE_CAPTURED;
        s->host[base + j] = 0;
    }
    p->n_marks += n;
    if (n > 0) {
        // after the graph, on the stream it was launched on: its marks' times to their host slots
        CUDA_CHECK(cudaMemcpyAsync(s->host + base, g->stamps, n * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                   ctx->stream(ctx->device, 0)));
    }
#else
    GGML_UNUSED(replayed);
    GGML_UNUSED(cgraph);
#endif
}

static thread_local ggml_backend_cuda_context * ggml_cuda_instr_thread_ctx = nullptr;

ggml_backend_cuda_context * ggml_cuda_instr_thread(int device) {
    ggml_backend_cuda_context * ctx = ggml_cuda_instr_thread_ctx;
    return ctx && ctx->instr_prof && ctx->instr_prof->sync_copies && ctx->device == device ? ctx : nullptr;
}

void ggml_cuda_instr_copy(ggml_backend_cuda_context * ctx,
                          cudaStream_t                stream,
                          int                         stream_no,
                          int                         kind,
                          const ggml_tensor *         tensor,
                          size_t                      bytes,
                          int                         flags) {
    ggml_cuda_instr * s = ctx->instr;
    if (s->capturing) {
        return;  // (copies are never captured: only graph computes are)
    }
    ggml_cuda_instr_append(s, stream, stream_no, kind, nullptr, -1, tensor, (int64_t) bytes, flags);
}

int ggml_backend_cuda_set_profiler(ggml_backend_t backend, ggml_cuda_profiler * profiler) {
    if (!ggml_backend_is_cuda(backend)) {
        return -1;
    }
    ggml_backend_cuda_context * ctx = (ggml_backend_cuda_context *) backend->context;
    if (!profiler) {
        ctx->instr_prof = nullptr;
        if (ctx->instr) {
            ctx->instr->p = nullptr;
        }
        if (ggml_cuda_instr_thread_ctx == ctx) {
            ggml_cuda_instr_thread_ctx = nullptr;
        }
        return 0;
    }
    if (profiler->selection < 1 || profiler->selection > 15 || profiler->cap < 0 || !profiler->marks) {
        return -1;
    }
    if (!ctx->instr) {
        ctx->instr = new (std::nothrow) ggml_cuda_instr;
        if (!ctx->instr) {
            return -1;
        }
    }
    ggml_cuda_instr * s = ctx->instr;
    if (s->host_cap < profiler->cap) {
        // the slots may still be written by work queued before: wait for it, then keep the times
        // of the marks not collected yet
        ggml_cuda_set_device(ctx->device);
        for (int j = 0; j < GGML_CUDA_MAX_STREAMS; j++) {
            if (ctx->streams[ctx->device][j]) {
                CUDA_CHECK(cudaStreamSynchronize(ctx->streams[ctx->device][j]));
            }
        }
        CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
        void * h = nullptr;
        if (cudaHostAlloc(&h, (size_t) profiler->cap * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable) !=
            cudaSuccess) {
            (void) cudaGetLastError();
            return -1;
        }
        void * d = nullptr;
        if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
            (void) cudaGetLastError();
            CUDA_CHECK(cudaFreeHost(h));
            return -1;
        }
        if (s->host) {
            memcpy(h, s->host, (size_t) s->host_cap * sizeof(uint64_t));
            CUDA_CHECK(cudaFreeHost(s->host));
        }
        s->host     = (uint64_t *) h;
        s->host_dev = (uint64_t *) d;
        s->host_cap = profiler->cap;
    }
    s->p                       = profiler;
    ctx->instr_prof            = profiler;
    ggml_cuda_instr_thread_ctx = ctx;
    return 0;
}

int ggml_backend_cuda_profiler_collect(ggml_backend_t       backend,
                                       ggml_cuda_profiler * profiler,
                                       int32_t              begin,
                                       int32_t              end) {
    if (!ggml_backend_is_cuda(backend) || !profiler) {
        return -1;
    }
    const ggml_backend_cuda_context * ctx = (const ggml_backend_cuda_context *) backend->context;
    const ggml_cuda_instr *           s   = ctx->instr;
    if (!s || !s->host) {
        return -1;
    }
    const int32_t n = std::min({ profiler->n_marks, profiler->cap, s->host_cap });
    begin           = std::max(begin, 0);
    end             = std::min(end, n);
    for (int32_t k = begin; k < end; k++) {
        const uint64_t t         = s->host[k];
        profiler->marks[k].t     = t;
        profiler->marks[k].valid = t != 0;
    }
    return 0;
}

// the clock pair's kernel: its timer's step, then a round trip per round through mapped memory:
// the host raises the flag to 2r+1, the kernel answers its time and 2r+2
static constexpr uint32_t GGML_CUDA_INSTR_CLOCK_ABORT  = 0xffffffffu;
static constexpr int      GGML_CUDA_INSTR_CLOCK_ROUNDS = 5;

static __global__ void ggml_cuda_instr_clock(volatile uint32_t * flag, volatile uint64_t * out, int n_rounds) {
    uint64_t t0 = ggml_cuda_instr_globaltimer(), t1 = t0, t2 = t0;
    for (int n = 0; n < (1 << 24) && t1 == t0; n++) {
        t1 = ggml_cuda_instr_globaltimer();
    }
    for (int n = 0; n < (1 << 24) && t2 == t1; n++) {
        t2 = ggml_cuda_instr_globaltimer();
    }
    out[n_rounds]           = t2 - t1;
    const uint64_t deadline = t2 + 100000000ull;  // 100 ms: never spin longer
    for (int r = 0; r < n_rounds; r++) {
        uint32_t f;
        while ((f = *flag) != 2u * r + 1u) {
            if (f == GGML_CUDA_INSTR_CLOCK_ABORT || ggml_cuda_instr_globaltimer() > deadline) {
                return;
            }
        }
        out[r] = ggml_cuda_instr_globaltimer();
        __threadfence_system();
        *flag = 2u * r + 2u;
        __threadfence_system();
    }
}

// the host clock a clock pair is on when the caller names none
static int64_t ggml_cuda_instr_monotonic_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int ggml_backend_cuda_clock_pair(ggml_backend_t backend,
                                 int32_t        method,
                                 int64_t (*now)(void),
                                 ggml_gpu_clock_pair * pair) {
    if (!ggml_backend_is_cuda(backend) || !pair || (method != GGML_GPU_CLOCK_ANY && method != GGML_GPU_CLOCK_KERNEL)) {
        return -1;
    }
    if (!now) {
        now = ggml_cuda_instr_monotonic_ns;
    }
    ggml_backend_cuda_context * ctx = (ggml_backend_cuda_context *) backend->context;
    if (!ctx->instr) {
        ctx->instr = new (std::nothrow) ggml_cuda_instr;
        if (!ctx->instr) {
            return -1;
        }
    }
    ggml_cuda_instr * s = ctx->instr;
    ggml_cuda_set_device(ctx->device);
    if (!s->clock_mem) {
        void * h = nullptr;
        if (cudaHostAlloc(&h, 64 + 8 * (GGML_CUDA_INSTR_CLOCK_ROUNDS + 1), cudaHostAllocMapped) != cudaSuccess) {
            (void) cudaGetLastError();
            return -1;
        }
        s->clock_mem  = h;
        s->clock_flag = (volatile uint32_t *) h;
        s->clock_out  = (volatile uint64_t *) ((char *) h + 64);
    }
    if (!s->clock_stream && cudaStreamCreateWithFlags(&s->clock_stream, cudaStreamNonBlocking) != cudaSuccess) {
        (void) cudaGetLastError();
        s->clock_stream = nullptr;
        return -1;
    }
    void * mem_dev = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(&mem_dev, s->clock_mem, 0));
    uint32_t * flag_dev = (uint32_t *) mem_dev;
    uint64_t * out_dev  = (uint64_t *) ((char *) mem_dev + 64);
    *s->clock_flag      = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ggml_cuda_instr_clock<<<1, 1, 0, s->clock_stream>>>(flag_dev, out_dev, GGML_CUDA_INSTR_CLOCK_ROUNDS);
    CUDA_CHECK(cudaGetLastError());

    const int64_t timeout = 50 * 1000 * 1000;
    bool          have    = false;
    for (int r = 0; r < GGML_CUDA_INSTR_CLOCK_ROUNDS; r++) {
        const int64_t t0 = now();
        *s->clock_flag   = 2u * r + 1u;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        int64_t t1 = t0;
        while (*s->clock_flag != 2u * r + 2u && (t1 = now()) - t0 < timeout) {
        }
        if (*s->clock_flag != 2u * r + 2u) {
            break;  // no answer: the kernel never ran, or gave up
        }
        t1 = now();
        std::atomic_thread_fence(std::memory_order_seq_cst);
        const int64_t dev = (t1 - t0 + 1) / 2;
        if (!have || dev < pair->max_deviation_ns) {
            pair->device_time      = s->clock_out[r];
            pair->host_ns          = t0 + (t1 - t0) / 2;
            pair->max_deviation_ns = dev;
            have                   = true;
        }
    }
    *s->clock_flag = GGML_CUDA_INSTR_CLOCK_ABORT;  // a kernel still waiting returns
    std::atomic_thread_fence(std::memory_order_seq_cst);
    CUDA_CHECK(cudaStreamSynchronize(s->clock_stream));
    pair->resolution_ns = have ? (int64_t) s->clock_out[GGML_CUDA_INSTR_CLOCK_ROUNDS] : 0;
    pair->method        = GGML_GPU_CLOCK_KERNEL;
    return have ? 0 : -1;
}
