#pragma once

// llamacpp-instr: for its tests only, not part of the API, compiled only into the testing build
// (`instr build --testing`, CMake option LLAMA_INSTR_TESTING). Allocation-failure injection, to
// prove that no exception crosses the C API: global operator new is replaced by one that counts
// the allocations made on behalf of llama_instr code (a llama_instr function is on the calling
// thread's stack) and throws std::bad_alloc at the chosen one.

#include "llama.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// From now on, fail the n-th allocation made on behalf of llama_instr code (n >= 1; 0 disarms).
// Counts from zero again at each call.
LLAMA_API void llama_instr_test_fail_alloc(int64_t n);

// How many allocations were injected as failures since the last llama_instr_test_fail_alloc.
LLAMA_API int64_t llama_instr_test_failed_allocs(void);

// How many KV caches and recurrent states the memory table knows now (each context's cache is
// known from its allocation until its last buffer is freed); -1 if the table could not be read.
LLAMA_API int64_t llama_instr_test_memory_caches(void);

// How many contexts have a state in the registry now (each made at a context's first hook that
// creates one, dropped when the context is freed); -1 if the registry could not be read.
LLAMA_API int64_t llama_instr_test_ctx_states(void);

// A graph of two ops (a scale, then a custom op) computed on a CPU backend of n_threads with the
// per-node profiler set, the last op's work deliberately uneven: every thread but thread 0 spends
// slow_ns more on it. *last_op_ns = the last op's profiled duration. LLAMA_INSTR_OK, or
// LLAMA_INSTR_ERR_INTERNAL when no CPU backend with a profiler could be made.
LLAMA_API int32_t llama_instr_test_last_op_ns(int32_t n_threads, int64_t slow_ns, int64_t * last_op_ns);

// on != 0: every step's records wait for the host's next synchronization of its context (or the
// next step), as a step with CUDA marks to read does; 0: as the op timers decide.
LLAMA_API void llama_instr_test_defer_steps(int32_t on);

// on != 0: the devices of every scheduler made from now on are taken for ones that may still
// compute after a split returns (a GPU's), as if the CPU were one: with no op timer that
// synchronizes, a step's records wait for the host's synchronization.
LLAMA_API void llama_instr_test_async_devices(int32_t on);

// Each deferred step's writing takes `us` microseconds longer (0: as it takes): a slow disk's
// stand-in, so that a test sees which account its time lands in.
LLAMA_API void llama_instr_test_write_delay(int64_t us);

#ifdef __cplusplus
}
#endif
