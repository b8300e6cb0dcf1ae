#include "llama-instr-bench.h"

#include "ggml.h"

#include <atomic>

static std::atomic<int64_t> g_bench_cb_eval_count{ 0 };

bool llama_instr_bench_cb_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    GGML_UNUSED(t);
    GGML_UNUSED(user_data);
    if (!ask) {
        g_bench_cb_eval_count.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
}

int64_t llama_instr_bench_cb_eval_count(void) {
    return g_bench_cb_eval_count.load(std::memory_order_relaxed);
}
