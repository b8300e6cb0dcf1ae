#pragma once

// llamacpp-instr: what a context's host did between two of its steps (a `host` record per step),
// and each sampler chain's own counters (a `chain` record). Sampling is recorded per output: the
// chain's samplers one by one (llama-sampler.cpp's hooks), the grammar and the candidates apart
// (common/sampling.cpp, through llama-instr.h), and the program's own work (llama-server's
// detokenizing, stop checks, responses and batch). Every part is summed per sequence and per
// name in the context's window, which the context's next step writes, or its free (the hook
// context_forget, from the hook llama_instr_context_free) or the session's end.

#include "llama.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace llama_instr {

struct ctx_state;

// A name and its time, summed over a window for one sequence.
struct host_part {
    char    name[32];
    int8_t  kind;  // enum llama_instr_part_kind
    int64_t ns;
    int64_t n;
};

// One sequence's share of a window, for one request.
struct host_seq {
    int32_t                seq;            // -1: not told (an accept outside any sampling, say)
    std::string            request;
    int64_t                n_sampled = 0;  // outputs sampled
    int64_t                sample_ns = 0;  // sampling scopes, end to end
    int64_t                chain_ns  = 0;  // of which in the chain's apply and accept (what llama_perf_sampler counts)
    int64_t                host_ns   = 0;  // the program's own work
    int64_t                t_first   = 0;
    int64_t                t_last    = 0;
    std::vector<host_part> parts;
    size_t                 n_parts = 0;
};

// A context's window: what its host did since its last step ended. The decoding thread labels it
// with the step (host_step_end) and writes it before its next step (host_step_begin); samplings
// on any thread add to it under `mtx`.
struct host_window {
    std::mutex mtx;

    // the level of the step the window follows (OFF: no step in this session yet); read without
    // the lock to decide what a sampling records
    std::atomic<int32_t> level{ 0 };

    uint64_t    epoch = 0;
    std::string sid;
    int32_t     ctx_id = 0;
    int64_t     step   = -1;
    std::string ctx_request;  // the context's request tag (llama_instr_set_request) at that step

    // the decoding thread's CPU time at the step's end (-1: unknown), and the CPU time it used
    // until the next step began (-1: not known yet, or another thread decoded it)
    int64_t         cpu_at_end = -1;
    std::thread::id cpu_thread;
    int64_t         cpu_ns = -1;

    std::vector<host_seq> seqs;
    size_t                n_seqs    = 0;
    int64_t               n_dropped = 0;  // parts past the bounds (their time is in the totals)

    // the step's outputs: each batch index's first sequence, and each output row's batch index
    std::vector<int32_t> tok_seq;
    std::vector<int32_t> out_tok;

    // the request each sequence serves (llama_instr_set_seq_request), at most MAX_SEQ_REQUESTS
    std::vector<std::pair<int32_t, std::string>> seq_request;

    // llama.cpp's counters of the context (llama_perf_context) as its decoding thread read them at
    // its last synchronization (perf_seen; have_perf false: none yet): the session's end writes
    // these when another thread may be decoding the context, whose counters it must not read
    bool                    have_perf = false;
    llama_perf_context_data perf{};
};

// llama_decode's hooks (the decoding thread): the window is written as the next step begins (once
// its step_begin is), and labelled with the step once it ended (its level, its outputs'
// sequences). The hooks' own work outside the steps' times, from `t_start` until now, is a part of
// the window: "log" after a step (formatting and writing its records, before llama_decode
// returns), "log-begin" before the next (its step_begin): the logger's cost between steps.
void host_step_begin(ctx_state & st, int64_t t_start);
void host_step_end(ctx_state & st, const llama_context * ctx, const llama_batch & batch, int64_t cpu_end);
void host_log_part(ctx_state & st, int64_t t_start, const char * name);

// Work on this thread from t_start to t_end that is no sampling's, though a sampling scope may be
// open around it: a synchronization of the context (the device's remaining work, the deferred
// step's records). The scope's time and parts leave it out.
void sampling_exclude(int64_t t_start, int64_t t_end) noexcept;

// This thread's CPU time (ns, CLOCK_THREAD_CPUTIME_ID), or -1 where there is none.
int64_t thread_cpu_ns() noexcept;

// The request sequence `seq` of st's context serves (-1: the context's own, as of its last step).
std::string seq_request(ctx_state & st, int32_t seq);

// The window's `host` record, made for session `epoch` (false: none); it empties the window.
bool host_record(ctx_state & st, uint64_t epoch, std::string & line);

// On ctx's decoding thread, once llama.cpp counted a synchronization: keep its counters for the
// session's end (host_window::perf).
void perf_seen(ctx_state & st, const llama_context * ctx);

// A `perf` record of ctx, llama.cpp's own counters of its decoding (llama_perf_context), when its
// state `st` is in session `epoch` and is a llama_context's (else false). At its free (`freeing`:
// nothing else uses ctx) they are read from ctx; at the session's end only on the thread that
// decoded its last step, else as perf_seen kept them (no record when it kept none).
bool perf_record(const llama_context * ctx, ctx_state & st, uint64_t epoch, bool freeing, std::string & line);

// The context `ctx` is freed (llama_instr_context_free, after its step that waited for a
// synchronization was written): its `host` and `perf` records, then its state goes. A step of it
// still open is counted no more, so that the log rotates again.
void context_forget(const llama_context * ctx) noexcept;

// At the session's end (with S().mtx held): a `chain` record for every chain still alive that the
// session saw, with llama.cpp's own counters.
void chains_session_end_locked(const std::string & sid, std::vector<std::string> & lines);

}  // namespace llama_instr
