#pragma once

// llamacpp-instr: the hooks llama-context.cpp calls. Internal to libllama; the public API is
// include/llama-instr.h.
//
// Every call site but llama_instr_context_free() checks llama_instr_enabled() first, so with no
// session open a hook costs one relaxed atomic load. Hooks never throw: a failure inside one is
// recorded on the session (records lost, reported by llama_instr_session_end).

#include "llama-instr.h"

#include <atomic>
#include <cstdint>

struct ggml_cgraph;
struct ggml_tensor;
struct llama_sampler;
typedef struct ggml_backend *       ggml_backend_t;
typedef struct ggml_backend_sched * ggml_backend_sched_t;

extern std::atomic<int32_t>  g_llama_instr_level;
// bumped by every change of g_llama_instr_level: a graph llama.cpp built or computed while the hooks
// were off was not seen (llama_instr_compute_begin then checks the graph it is given)
extern std::atomic<uint64_t> g_llama_instr_level_changes;

// set the level, counting the change; returns the level before. The count is raised before the
// level is stored, and the store releases it: a thread that reads the new level with acquire
// (llama_instr_level_changes_seen) reads the count raised too, never an older one.
static inline int32_t llama_instr_level_exchange(int32_t level) {
    g_llama_instr_level_changes.fetch_add(1, std::memory_order_relaxed);
    return g_llama_instr_level.exchange(level, std::memory_order_acq_rel);
}

// the changes of the level up to the one this thread sees now (acquire: see above)
static inline uint64_t llama_instr_level_changes_seen() {
    (void) g_llama_instr_level.load(std::memory_order_acquire);
    return g_llama_instr_level_changes.load(std::memory_order_acquire);
}

static inline bool llama_instr_enabled() {
    return g_llama_instr_level.load(std::memory_order_relaxed) != LLAMA_INSTR_LEVEL_OFF;
}

// llama_decode: begin returns the step's start time (ns), to pass to end.
int64_t llama_instr_decode_begin(llama_context * ctx, const llama_batch & batch);
void    llama_instr_decode_end(llama_context * ctx, const llama_batch & batch, int32_t ret, int64_t t_start);

// graph construction in process_ubatch: the callback names each layer's tensors; graph_built runs
// before the backend scheduler allocates the graph (and replaces sources with its copies)
void llama_instr_graph_build_begin(llama_context * ctx);
void llama_instr_graph_cb(llama_context * ctx, ggml_tensor * cur, int il);
void llama_instr_graph_built(llama_context * ctx, ggml_cgraph * gf);

// process_ubatch, before it computes the ubatch's graph: the ubatch's real token count
void llama_instr_ubatch_begin(llama_context * ctx, int32_t n_tokens);

// graph_compute: the CPU backend times each op between these two, and the scheduler records its
// splits and copies; end synchronizes the backends when an op timer needs it to (a CUDA
// device's marks are read later, after the host's own synchronization)
void llama_instr_compute_begin(llama_context *      ctx,
                               ggml_backend_t       backend_cpu,
                               ggml_backend_sched_t sched,
                               ggml_cgraph *        gf);
void llama_instr_compute_end(llama_context *      ctx,
                             ggml_backend_t       backend_cpu,
                             ggml_backend_sched_t sched,
                             ggml_cgraph *        gf,
                             int32_t              status);

// llama_context::synchronize, after the scheduler synchronized the backends and llama.cpp counted
// the decode in its own timings (t_eval_us), so that writing is none of theirs: a step whose
// records waited for it is written. `t_begin` is the synchronization's start (llama_instr_host_clock):
// a sampling scope open around it leaves it out.
void llama_instr_synchronized(llama_context * ctx, int64_t t_begin);

// ~llama_context, called whether or not a session is open: the context's instrumentation state is
// freed with the context and never before, so no hook or running compute can outlive it.
void llama_instr_context_free(const llama_context * ctx);

// What the backend buffers allocated on this thread are for, while a scope lives: llama.cpp opens
// one where it loads weights, makes a KV cache or recurrent state, reserves its output buffer and
// reserves or allocates compute graphs (llama-instr-memory.cpp). Always on, whether or not a
// session is open: a buffer's purpose can't be told afterwards, and setting it is two
// thread-local stores per allocation site, never per node.
enum llama_instr_purpose : int32_t {
    LLAMA_INSTR_PURPOSE_OTHER           = 0,
    LLAMA_INSTR_PURPOSE_WEIGHTS         = 1,
    LLAMA_INSTR_PURPOSE_KV_CACHE        = 2,  // owner: the llama_kv_cache (one per cache: an iSWA model has two)
    LLAMA_INSTR_PURPOSE_COMPUTE         = 3,  // owner: the llama_context
    LLAMA_INSTR_PURPOSE_OUTPUT          = 4,  // owner: the llama_context
    LLAMA_INSTR_PURPOSE_RECURRENT       = 5,  // owner: the llama_memory_recurrent
    LLAMA_INSTR_PURPOSE_HOST_PINNED     = 6,  // a GPU's host buffer with no other purpose (never set by a scope)
    // tools/mtmd's encoders (llama_instr_encoder_buffers): a projector file's weights, an encoder's
    // compute buffers; owner: the encoder
    LLAMA_INSTR_PURPOSE_ENCODER_WEIGHTS = 7,
    LLAMA_INSTR_PURPOSE_ENCODER_COMPUTE = 8,
};

struct llama_instr_purpose_scope {
    // `label` names a KV cache ("full" or "swa"); a string literal
    explicit llama_instr_purpose_scope(int32_t      purpose,
                                       const void * owner = nullptr,
                                       const char * label = nullptr) noexcept;
    ~llama_instr_purpose_scope() noexcept;

    llama_instr_purpose_scope(const llama_instr_purpose_scope &)             = delete;
    llama_instr_purpose_scope & operator=(const llama_instr_purpose_scope &) = delete;

  private:
    int32_t      prev_purpose;
    const void * prev_owner;
    int32_t      prev_cache;
};

// llama-sampler.cpp: a sampler chain's apply and accept (llama-instr-sampling.cpp). The outermost
// chain on a thread times itself (what llama_perf_sampler counts) and, at DETAILED, each of its
// samplers; a chain used outside any sampling scope opens one for the sequence it last sampled.
int64_t llama_instr_chain_begin(const llama_sampler * chain, bool * members, bool * opened) noexcept;
void    llama_instr_chain_end(int64_t t_start) noexcept;
void    llama_instr_chain_close() noexcept;
int64_t llama_instr_sampling_now() noexcept;
void    llama_instr_member_end(const llama_sampler * member, int64_t t_start) noexcept;
void    llama_instr_member_on_backend(const llama_sampler * member) noexcept;

// A chain is freed: its `chain` record, if a session saw it. g_llama_instr_chains counts the chains
// sessions saw that are alive (so that, with none, the hook is one relaxed load).
extern std::atomic<int32_t> g_llama_instr_chains;
void                        llama_instr_chain_free(const llama_sampler * chain) noexcept;

// Made just before llama's own timer of the chain (time_meas) and ended (end()) just before that
// timer ends, so that both time the same stretch, each offset by one clock read; a scope the chain
// opened is closed after llama's timer, by the destructor.
struct llama_instr_chain_scope {
    explicit llama_instr_chain_scope(const llama_sampler * chain) noexcept {
        if (llama_instr_enabled()) {
            t_start = llama_instr_chain_begin(chain, &members, &opened);
        }
    }

    void end() noexcept {
        if (t_start) {
            llama_instr_chain_end(t_start);
            t_start = 0;
        }
    }

    ~llama_instr_chain_scope() {
        end();
        if (opened) {
            llama_instr_chain_close();
        }
    }

    llama_instr_chain_scope(const llama_instr_chain_scope &)             = delete;
    llama_instr_chain_scope & operator=(const llama_instr_chain_scope &) = delete;

    // a sampler of the chain: its start (0 when samplers are not timed), then its end
    int64_t member_begin() const noexcept { return members ? llama_instr_sampling_now() : 0; }

    void member_end(const llama_sampler * member, int64_t t) const noexcept {
        if (t) {
            llama_instr_member_end(member, t);
        }
    }

    // a sampler of the chain that ran in the graph (backend sampling)
    void on_backend(const llama_sampler * member) const noexcept {
        if (members) {
            llama_instr_member_on_backend(member);
        }
    }

    int64_t t_start = 0;
    bool    members = false;
    bool    opened  = false;
};

// llama_sampler_sample: the sampling of one output (the public scope of llama-instr.h)
struct llama_instr_sample_scope {
    llama_instr_sample_scope(llama_context * ctx, int32_t idx, const llama_sampler * smpl) noexcept {
        if (llama_instr_enabled()) {
            handle = llama_instr_sample_begin(ctx, idx, smpl);
        }
    }

    ~llama_instr_sample_scope() {
        if (handle) {
            llama_instr_sample_end(handle);
        }
    }

    llama_instr_sample_scope(const llama_instr_sample_scope &)             = delete;
    llama_instr_sample_scope & operator=(const llama_instr_sample_scope &) = delete;

    int64_t clock() const noexcept { return handle ? llama_instr_sample_clock() : 0; }

    void part(int32_t kind, const char * name, int64_t t) const noexcept {
        if (t) {
            llama_instr_sample_part(kind, name, t);
        }
    }

    void on_backend(const llama_sampler * chain) const noexcept {
        if (handle) {
            llama_instr_sample_on_backend(chain);
        }
    }

    int64_t handle = 0;
};
