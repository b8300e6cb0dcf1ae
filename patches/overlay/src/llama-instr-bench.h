#pragma once

// llamacpp-instr: for bench/overhead.py only, not part of the API. The upstream-style peer: a
// cb_eval that asks to observe every node (which makes the scheduler split the graph and
// synchronize at each one) and counts them. Exported so that ctypes can hand it to a context.

#include "llama.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

LLAMA_API bool    llama_instr_bench_cb_eval(struct ggml_tensor * t, bool ask, void * user_data);
LLAMA_API int64_t llama_instr_bench_cb_eval_count(void);

#ifdef __cplusplus
}
#endif
