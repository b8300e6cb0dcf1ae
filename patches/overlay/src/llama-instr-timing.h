#pragma once

// llamacpp-instr: compute records. compute_begin arms the scheduler's profiler (splits, copies) and
// every backend's op timer (llama-instr-ops.h), compute_end collects what they measured into the
// step's records, and write_step_computes formats them (compute and tensor_stats records) once the
// step's end time is taken.

#include "llama-instr-session.h"

#include <atomic>

namespace llama_instr {

// the graph tables captured in the step, then its compute (and tensor_stats) records; emitted
// in that order and cleared
void write_step_computes(ctx_state & st);

// drop what the step holds to write (its graph tables, its computes' rows, its experts' routing):
// after they are written, or when the step is abandoned (llama-instr-step.h)
void clear_step_rows(ctx_state & st) noexcept;

// wait for ctx's backends (its scheduler's synchronization, without llama.cpp's own accounting)
void synchronize_backends(llama_context * ctx);

// The graph and compute hooks' work on st, for a llama_context's graph (ctx, its model, its count
// of graphs reused) or an encoder's (ctx and model nullptr, n_reused -1): graph_built indexes gf
// before `sched` allocates it, compute_begin arms the scheduler's profiler and every backend's op
// timer for st's current step, compute_end collects what they measured into a compute record.
void graph_built(ctx_state & st, ggml_backend_sched_t sched, ggml_cgraph * gf, const llama_model * model);
void compute_begin(ctx_state &           st,
                   const llama_context * ctx,
                   ggml_backend_sched_t  sched,
                   ggml_cgraph *         gf,
                   const llama_model *   model,
                   int32_t               n_reused);
void compute_end(ctx_state & st, ggml_backend_sched_t sched, int32_t status);

// tests only (llama_instr_test_defer_steps): every step's records wait for the host's next
// synchronization, as a step with CUDA marks to read does
extern std::atomic<bool> g_llama_instr_defer_steps;

// tests only (llama_instr_test_async_devices): every scheduler's devices are taken for ones that
// may still compute after a split returns (a GPU's), as if the CPU were one
extern std::atomic<bool> g_llama_instr_test_async;

// tests only (llama_instr_test_write_delay): a deferred step's writing takes this many us longer (a
// slow disk's stand-in, so that where its time is booked shows)
extern std::atomic<int64_t> g_llama_instr_write_delay_us;

}  // namespace llama_instr
