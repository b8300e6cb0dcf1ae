#pragma once

// llamacpp-instr: the one session of the process and the registry of context states, behind the C
// API (llama-instr-api.cpp) and the hooks' view of them (llama-instr-session.h). Everything here is
// guarded by session::mtx.

#include "llama-instr-log.h"
#include "llama-instr-session.h"

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
    int32_t     level     = LLAMA_INSTR_LEVEL_OFF;
    int32_t     topk      = 10;
    int32_t     topk_next = 10;

    int64_t            t_start   = 0;
    llama_instr_totals totals    = {};  // but n_records and n_lost: see log
    int32_t            n_graphs  = 0;
    int32_t            n_ctx_ids = 0;

    // every context that ran a hook, until it is freed
    std::unordered_map<const llama_context *, std::unique_ptr<ctx_state>> ctxs;

    // the flusher thread writes buffered lines that are due while no record arrives
    std::condition_variable flusher_cv;  // wakes it when a session begins
    bool                    flusher_started = false;
};

// Never destroyed: the flusher thread and the exit-time flush may use it to the very end.
session & S();

// Start the flusher thread and the exit-time flush, once (with S().mtx held). False if the thread
// could not be started.
bool start_flusher_locked(session & s) noexcept;

// The state of ctx in the registry, created on first use (with S().mtx held).
ctx_state & state_locked(session & s, const llama_context * ctx);

// st joins the open session: a new id (the one reserved for it by session_begin, if any), and its
// current graph announced again under a new id. Only on the thread that decodes st's context,
// which reads these fields without the lock (with S().mtx held).
void join_locked(session & s, ctx_state & st);

// The session's totals, with the log's record counts (with S().mtx held).
llama_instr_totals totals_locked(const session & s);

}  // namespace llama_instr
