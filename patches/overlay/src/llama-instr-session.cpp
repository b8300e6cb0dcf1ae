#include "ggml-backend.h"
#include "ggml-cpu-instr.h"
#include "ggml-cpu.h"
#include "llama-instr-hooks.h"
#include "llama-instr-memory.h"
#include "llama-instr-registry.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

std::atomic<int32_t>  g_llama_instr_level{ LLAMA_INSTR_LEVEL_OFF };
std::atomic<uint64_t> g_llama_instr_level_changes{ 0 };

namespace llama_instr {

std::atomic<bool> g_reopen{ false };

const char * level_name(int32_t level) {
    switch (level) {
        case LLAMA_INSTR_LEVEL_MINIMAL:
            return "minimal";
        case LLAMA_INSTR_LEVEL_DETAILED:
            return "detailed";
        case LLAMA_INSTR_LEVEL_VERBOSE:
            return "verbose";
        default:
            return "off";
    }
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
        try {
            if (s.log.fp && s.n_open_steps == 0 && rotation_waits_locked(s)) {
                new_file_locked(s);  // idle: a reopen asked for (SIGHUP), or a deferred rotation
            }
            if (s.log.fp && s.log.due(now_ns())) {
                s.log.write_buffered();
            }
        } catch (...) {
            // out of memory formatting the error: the status is set, the records counted
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
    st.file_index    = s.file_index;
    st.step_open     = false;
    st.step_waits    = false;
}

bool file_due_locked(const session & s) {
    if (!s.log.fp || (s.retry_after > 0 && now_ns() < s.retry_after)) {
        return false;
    }
    return s.log.full() || g_reopen.load(std::memory_order_relaxed);
}

bool rotation_waits_locked(const session & s) {
    return (s.rotate_deferred || g_reopen.load(std::memory_order_relaxed)) && file_due_locked(s);
}

void new_file_locked(session & s) {
    // by size, the files are renamed (LOG -> LOG.1 ...); asked for (logrotate moved the file), the
    // path is opened again as it is. A file that holds nothing (its head could not be written: the
    // disk is still full) is not rotated into the series but tried again
    const bool rotate = s.log.full() && s.log.file_bytes > 0;
    s.rotate_deferred = false;
    g_reopen.store(false, std::memory_order_relaxed);
    if (!s.log.reopen(rotate)) {
        s.retry_after = now_ns() + 10 * 1000 * 1000 * 1000LL;  // (a warning said why)
        return;
    }
    s.retry_after = 0;
    s.file_index++;
    // the new file begins as the session did, so that it reads and converts alone: the same
    // session_start, saying which file of the session it is (the graph tables follow with the
    // first step of each context that uses them: ctx_join)
    const int64_t t = now_ns();
    std::string   line;
    json_out      j{ line };
    record_head(j, "session_start", t, s.sid);
    j.key("file");
    j.raw("{\"index\":");
    j.i64(s.file_index);
    j.raw(",\"t_session\":");
    j.i64(s.t_start);
    j.raw(",\"records_before\":");
    j.i64(s.log.n_records);
    j.ch('}');
    j.raw(s.start_body);
    j.ch('}');
    s.log.emit(line);
    // and with the buffers that exist, so that it tells where memory is without the files before
    std::vector<std::string> memory_lines;
    memory_snapshot_lines(s.sid, memory_lines);
    for (const std::string & l : memory_lines) {
        s.log.emit(l);
    }
    s.log.write_buffered();
}

// Bumped whenever a context's state is freed, which invalidates every thread's cached lookup (a
// new context can be allocated at a freed one's address).
static std::atomic<uint64_t> g_ctx_frees{ 0 };

// The state of ctx, made when `create` (else nullptr when it has none). The graph callback runs once
// per named tensor and a sampler once per output: remember this thread's last lookup. The state
// can't be freed while its context is in use, so the pointer stays valid while it is cached.
static ctx_state * ctx_lookup(const llama_context * ctx, bool create) noexcept {
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
        auto                        it = s.ctxs.find(ctx);
        if (it == s.ctxs.end() && !create) {
            return nullptr;
        }
        c_ctx   = ctx;
        c_state = create ? &state_locked(s, ctx) : it->second.get();
        c_frees = frees;
        return c_state;
    } catch (...) {
        return nullptr;  // out of memory: the caller skips this hook
    }
}

ctx_state * ctx_get(const llama_context * ctx) noexcept {
    return ctx_lookup(ctx, true);
}

ctx_state * ctx_find(const llama_context * ctx) noexcept {
    return ctx_lookup(ctx, false);
}

// The level of st's step: the session's, or MINIMAL for a step that sampling leaves out.
static int32_t step_level_locked(const session & s, const ctx_state & st) {
    const int32_t level = g_llama_instr_level.load(std::memory_order_relaxed);
    if (level <= LLAMA_INSTR_LEVEL_MINIMAL) {
        return level;
    }
    bool full = s.sample_steps <= 1 || st.step % s.sample_steps == 0;
    if (full && s.sample_requests > 1) {
        // a step serving a sampled request (on the whole context, or on one of its sequences)
        if (st.sample_epoch != s.epoch) {
            return LLAMA_INSTR_LEVEL_MINIMAL;  // no request of this session began on it
        }
        full = st.request_full == 1;
        for (const auto & q : st.seqs) {
            full = full || (q.seq >= 0 && (size_t) q.seq < st.seq_full.size() && st.seq_full[q.seq] == 1);
        }
    }
    return full ? level : LLAMA_INSTR_LEVEL_MINIMAL;
}

// How long a step that finds a new file due waits for the other contexts' open steps to end.
static constexpr std::chrono::milliseconds ROTATE_WAIT{ 50 };

bool ctx_join(ctx_state & st, int32_t n_tokens, bool prompt) {
    auto &                       s = S();
    std::unique_lock<std::mutex> lock(s.mtx);
    if (!s.log.fp) {
        return false;
    }
    if (file_due_locked(s)) {
        // a new file begins between steps: the other contexts' open steps end first, for
        // ROTATE_WAIT at most, so that a rotation never holds a decode for long; past it this step
        // goes on in the current file, and the file is started at the next moment no step is open
        // (the last open step's end, a later step's start, or the flusher). A step whose records
        // wait for its context's synchronization is not waited for: it ends when its owner next
        // reads outputs, however long that is
        if (s.n_open_steps > s.n_deferred_steps) {
            s.steps_cv.wait_for(lock, ROTATE_WAIT, [&s] { return s.n_open_steps == s.n_deferred_steps || !s.log.fp; });
            if (!s.log.fp) {
                return false;
            }
        }
        // (another context's step may have started it meanwhile)
        if (s.n_open_steps == 0 && file_due_locked(s)) {
            try {
                new_file_locked(s);
            } catch (...) {
                s.log.hook_failed("llama_instr_decode_begin");  // out of memory: its head is lost
            }
        } else if (s.n_open_steps > 0) {
            s.rotate_deferred = true;
        }
    }
    if (st.epoch != s.epoch) {
        join_locked(s, st);
    }
    if (st.file_index != s.file_index) {
        // a new file: it holds the node table of each graph its steps use
        st.file_index    = s.file_index;
        st.graph_emitted = false;
    }
    st.request          = st.request_next;
    st.capture.patterns = st.capture_next;
    st.step             = s.totals.n_steps++;
    st.level            = step_level_locked(s, st);
    st.step_open        = true;
    st.step_waits       = false;
    s.n_open_steps++;
    s.totals.n_tokens += n_tokens;
    (prompt ? s.totals.n_prompt_tokens : s.totals.n_gen_tokens) += n_tokens;
    return true;
}

void step_done_locked(session & s, ctx_state & st) noexcept {
    if (!st.step_open || st.epoch != s.epoch || !s.log.fp) {
        st.step_open  = false;
        st.step_waits = false;
        return;
    }
    st.step_open = false;
    if (st.step_waits) {
        st.step_waits = false;
        s.n_deferred_steps--;
    }
    if (--s.n_open_steps == 0) {
        s.steps_cv.notify_all();
        // a file due by size begins with the next step (so that a session whose last step filled
        // its file ends there, not in a file of its own); one a step had to defer, or a reopen
        // asked for, begins now
        if (rotation_waits_locked(s)) {
            try {
                new_file_locked(s);
            } catch (...) {
                // out of memory formatting the new file's head: its status is set, records counted
            }
        }
    }
}

void step_done(ctx_state & st) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        step_done_locked(s, st);
    } catch (...) {
        // the lock failed (std::system_error): the step stays counted
    }
}

void step_deferred(ctx_state & st) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (st.step_open && !st.step_waits && st.epoch == s.epoch && s.log.fp) {
            st.step_waits = true;
            s.n_deferred_steps++;
            if (s.n_open_steps == s.n_deferred_steps) {
                s.steps_cv.notify_all();  // a step waiting to rotate need wait no longer
            }
        }
    } catch (...) {
        // the lock failed: the step is waited for as an open one
    }
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

std::unique_ptr<ctx_state> ctx_forget_locked(session & s, const llama_context * ctx) {
    auto it = s.ctxs.find(ctx);
    if (it == s.ctxs.end()) {
        return nullptr;
    }
    std::unique_ptr<ctx_state> dead = std::move(it->second);
    s.ctxs.erase(it);
    g_ctx_frees.fetch_add(1, std::memory_order_release);
    return dead;
}

}  // namespace llama_instr
