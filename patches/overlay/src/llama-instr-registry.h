#pragma once

// llamacpp-instr: the one session of the process and the registry of context states, behind the C
// API (llama-instr-api.cpp) and the hooks' view of them (llama-instr-session.h). Everything here is
// guarded by session::mtx.

#include "llama-instr-log.h"
#include "llama-instr-session.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace llama_instr {

struct session {
    std::mutex mtx;

    uint64_t    epoch = 0;  // bumped by each session_begin
    log_file    log;        // log.fp is set while a session is open
    std::string sid;
    int32_t     topk      = 10;
    int32_t     topk_next = 10;

    int64_t            t_start   = 0;
    llama_instr_totals totals    = {};  // but n_records and n_lost: see log
    int32_t            n_graphs  = 0;
    int32_t            n_ctx_ids = 0;

    // sampling: one step in sample_steps, and the steps of one request in sample_requests, at the
    // session's level, the others at MINIMAL (llama_instr_set_sampling, for the next session)
    int32_t sample_steps         = 1;
    int32_t sample_requests      = 1;
    int32_t sample_steps_next    = 1;
    int32_t sample_requests_next = 1;
    int64_t n_requests           = 0;  // requests begun (llama_instr_request_begin)

    // bounded files (llama_instr_set_rotation, for the next session): each new file starts with
    // session_start's fields again (start_body, after the record's head), between steps only
    int64_t                 max_bytes_next = 0;
    int32_t                 keep_next      = 0;
    std::string             start_body;
    int32_t                 file_index       = 0;  // files begun after the first (rotations and reopens)
    int64_t                 retry_after      = 0;  // after a failed rotation or reopen, no new try before this (ns)
    int32_t                 n_open_steps     = 0;  // steps begun and not ended
    // of which steps whose records wait for their context's synchronization (step_deferred): a
    // rotation does not wait for them (their owner's next read of outputs ends them), it begins
    // once they are written
    int32_t                 n_deferred_steps = 0;
    // a step found a new file due but other contexts' steps stayed open past ROTATE_WAIT: the file
    // begins at the next moment no step is open (the last open step's end, or the flusher)
    bool                    rotate_deferred  = false;
    std::condition_variable steps_cv;  // notified when no step is open any more

    // every context that ran a hook, until it is freed
    std::unordered_map<const llama_context *, std::unique_ptr<ctx_state>> ctxs;

    // the flusher thread writes buffered lines that are due while no record arrives
    std::condition_variable flusher_cv;  // wakes it when a session begins
    bool                    flusher_started = false;
};

// Set by llama_instr_reopen (from a signal handler, say): the log is reopened at its path at the
// next step boundary, or by the flusher thread when no step is open.
extern std::atomic<bool> g_reopen;

// Is a new file due (a reopen asked for, or the log full)? With S().mtx held.
bool file_due_locked(const session & s);

// Start the new file that is due: rotate (the log is full) or reopen (asked for), then write its
// session_start. Only between steps (no step open), with S().mtx held.
void new_file_locked(session & s);
// Is a new file due that should begin as soon as no step is open: one a step deferred (other
// contexts' steps stayed open), or a reopen asked for (SIGHUP)?
bool rotation_waits_locked(const session & s);

// Never destroyed: the flusher thread and the exit-time flush may use it to the very end.
session & S();

// Start the flusher thread and the exit-time flush, once (with S().mtx held). False if the thread
// could not be started.
bool start_flusher_locked(session & s) noexcept;

// The state of ctx in the registry, created on first use (with S().mtx held).
ctx_state & state_locked(session & s, const llama_context * ctx);

// ctx's state taken out of the registry (null: it has none), to be freed after the lock is
// released; every thread's cached lookup is invalidated (with S().mtx held).
std::unique_ptr<ctx_state> ctx_forget_locked(session & s, const llama_context * ctx);

// st's step is no longer open (step_done, with S().mtx held): between steps, a new file that is
// due is started.
void step_done_locked(session & s, ctx_state & st) noexcept;

// st joins the open session: a new id (the one reserved for it by session_begin, if any), and its
// current graph announced again under a new id. Only on the thread that decodes st's context,
// which reads these fields without the lock (with S().mtx held).
void join_locked(session & s, ctx_state & st);

// The session's totals, with the log's record counts (with S().mtx held).
llama_instr_totals totals_locked(const session & s);

}  // namespace llama_instr
