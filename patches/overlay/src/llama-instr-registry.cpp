// llamacpp-instr: the process's one session (S) and the host clock every record is on (now_ns),
// beneath the session's code and the memory table's, which both write through them.

#include "llama-instr-registry.h"

#include "ggml-backend.h"
#include "ggml-cpu-instr.h"

#include <chrono>

namespace llama_instr {

// The CPU backend's profiler clock, looked up once through its registry (the backend may be a
// loadable module); nullptr without a CPU backend, when there are no profiler times to compare.
static ggml_cpu_profiler_now_t profiler_clock() noexcept {
    try {
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
        return reg ? (ggml_cpu_profiler_now_t) ggml_backend_reg_get_proc_address(reg, "ggml_cpu_profiler_now") :
                     nullptr;
    } catch (...) {
        return nullptr;
    }
}

int64_t now_ns() {
    static const ggml_cpu_profiler_now_t clock = profiler_clock();
    if (clock) {
        return clock();
    }
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

session & S() {
    static session * s = new session;
    return *s;
}

}  // namespace llama_instr
