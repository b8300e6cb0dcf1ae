#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-instr-hooks.h"
#include "llama-instr-registry.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

std::atomic<int32_t> g_llama_instr_level{ LLAMA_INSTR_LEVEL_OFF };

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

// Writes the buffered lines that are due, so that an idle process's records reach the file within
// about FLUSH_NS (the hot path only checks on the next record).
static void flusher_main() {
    session &                    s = S();
    std::unique_lock<std::mutex> lock(s.mtx);
    for (;;) {
        if (s.log.fp) {
            s.flusher_cv.wait_for(lock, std::chrono::nanoseconds(log_file::FLUSH_NS / 4));
        } else {
            s.flusher_cv.wait(lock);
        }
        if (s.log.fp && s.log.due(now_ns())) {
            try {
                s.log.write_buffered();
            } catch (...) {
                // out of memory formatting the error: the status is set, the records counted
            }
        }
    }
}

// At exit, the lines still buffered go to the file (the session stays open: records made after
// this are dropped with the process).
static void flush_at_exit() {
    session &                   s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (s.log.fp) {
        try {
            s.log.write_buffered();
        } catch (...) {
        }
    }
}

bool start_flusher_locked(session & s) noexcept {
    if (!s.flusher_started) {
        try {
            std::thread(flusher_main).detach();
        } catch (...) {
            return false;
        }
        s.flusher_started = true;
        atexit(flush_at_exit);
    }
    s.flusher_cv.notify_one();
    return true;
}

llama_instr_totals totals_locked(const session & s) {
    llama_instr_totals t = s.totals;
    t.n_records          = s.log.n_records;
    t.n_lost             = s.log.n_lost;
    return t;
}

ctx_state & state_locked(session & s, const llama_context * ctx) {
    auto & p = s.ctxs[ctx];
    if (!p) {
        p = std::make_unique<ctx_state>();
    }
    return *p;
}

void join_locked(session & s, ctx_state & st) {
    st.epoch         = s.epoch;
    st.id            = st.reserved_epoch == s.epoch ? st.reserved_id : ++s.n_ctx_ids;
    st.sid           = s.sid;
    st.topk          = s.topk;
    st.graph_id      = 0;
    st.graph_emitted = false;
}

// Bumped whenever a context's state is freed, which invalidates every thread's cached lookup (a
// new context can be allocated at a freed one's address).
static std::atomic<uint64_t> g_ctx_frees{ 0 };

ctx_state * ctx_get(const llama_context * ctx) noexcept {
    // The graph callback runs once per named tensor: remember this thread's last lookup. The state
    // can't be freed while its context is in use, so the pointer stays valid while it is cached.
    thread_local const llama_context * c_ctx   = nullptr;
    thread_local ctx_state *           c_state = nullptr;
    thread_local uint64_t              c_frees = 0;
    const uint64_t                     frees   = g_ctx_frees.load(std::memory_order_acquire);
    if (ctx == c_ctx && frees == c_frees && c_state) {
        return c_state;
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        ctx_state &                 st = state_locked(s, ctx);
        c_ctx                          = ctx;
        c_state                        = &st;
        c_frees                        = frees;
        return c_state;
    } catch (...) {
        return nullptr;  // out of memory: the caller skips this hook
    }
}

bool ctx_join(ctx_state & st, int32_t n_tokens, bool prompt) {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (!s.log.fp) {
        return false;
    }
    if (st.epoch != s.epoch) {
        join_locked(s, st);
    }
    st.level            = g_llama_instr_level.load(std::memory_order_relaxed);
    st.request          = st.request_next;
    st.capture.patterns = st.capture_next;
    st.step             = s.totals.n_steps++;
    s.totals.n_tokens += n_tokens;
    (prompt ? s.totals.n_prompt_tokens : s.totals.n_gen_tokens) += n_tokens;
    return true;
}

int32_t next_graph_id(const ctx_state & st) {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    return st.epoch == s.epoch ? ++s.n_graphs : 0;
}

void count_compute(const ctx_state & st, int64_t n_lost, int64_t n_computes) {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (st.epoch == s.epoch && s.log.fp) {
        s.totals.n_computes += n_computes;
        s.log.n_lost += n_lost;  // op timings that could not be attributed
    }
}

void emit(uint64_t epoch, const std::string & line) {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (s.log.fp && epoch == s.epoch) {
        s.log.emit(line);
    }
}

void hook_failed(uint64_t epoch, const char * hook) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.log.fp && epoch == s.epoch) {
            s.log.hook_failed(hook);
        }
    } catch (...) {
        // the lock failed (std::system_error): nothing is left to record it with
    }
}

}  // namespace llama_instr

using namespace llama_instr;

//
// the hook that ends a context's state
//

void llama_instr_context_free(const llama_context * ctx) {
    try {
        auto &                      s = S();
        std::unique_ptr<ctx_state>  dead;
        std::lock_guard<std::mutex> lock(s.mtx);
        auto                        it = s.ctxs.find(ctx);
        if (it != s.ctxs.end()) {
            dead = std::move(it->second);  // freed after the lock is released
            s.ctxs.erase(it);
            g_ctx_frees.fetch_add(1, std::memory_order_release);
        }
    } catch (...) {
        // nothing to report to: the context is going away
    }
}
