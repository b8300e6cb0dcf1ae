#pragma once

// llamacpp-instr: what llama-server's host does between two steps, beside its sampling (which
// common's sampler records itself): detokenizing each token, the stop checks and partial response
// of process_token, the final response, and building the next batch, each as a part of the
// context's `host` record for the slot's sequence (llama-instr.h's llama_instr_host_part). And per
// request (its `request` record): when its last token was sampled, and the HTTP thread's time
// writing its streamed chunks. Included by llama-instr-tools.h; with no session open each call is
// one relaxed atomic load in libllama.

#include "llama-instr-tools.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace llama_instr_tools {

// a request's share of the host's work (request_state::host)
struct host_totals {
    int64_t t_last_token_us = 0;  // when the slot sampled its last token (ggml_time_us)
    int64_t send_ns         = 0;  // the HTTP thread writing its chunks
    int64_t sends           = 0;
};

// The `request` record's fields of the host's work: "last_token" (ns from arrival until its last
// token was sampled, where the server's own timings end), "send_ns" and "sends" (its streamed
// chunks written).
inline std::string host_fields(const request_state & r) {
    if (!r.host) {
        return "";
    }
    const host_totals & h = *r.host;
    std::string         f;
    const int64_t       t_last = h.t_last_token_us * 1000;
    if (h.t_last_token_us > 0 && t_last >= r.t_arrive) {
        f += ",\"last_token\":" + std::to_string(t_last - r.t_arrive);
    }
    if (h.sends > 0) {
        f += ",\"send_ns\":" + std::to_string(h.send_ns) + ",\"sends\":" + std::to_string(h.sends);
    }
    return f;
}

// With requests_mutex() held: r's host totals, made on first use.
inline host_totals & host_of_locked(request_state & r) {
    if (!r.host) {
        r.host = std::make_shared<host_totals>();
    }
    return *r.host;
}

// A hook of the HTTP or slot side failed (std::bad_alloc, or a lock's std::system_error): what it
// was recording is lost, counted in the session's lost records as a refused record is.
inline void host_lost() noexcept {
    llama_instr_write_record("request", nullptr);
}

// The slot `slot` of `ctx` began the task `task_id`: the `host` records name the request it serves
// (its record's id, whichever of the request's tasks it is) for the slot's sequence, and none for a
// task no record will name (its request arrived before the session).
inline void host_request(llama_context * ctx, int slot, int task_id) noexcept {
    if (!active()) {
        return;
    }
    try {
        std::string id;
        {
            std::lock_guard<std::mutex> lock(requests_mutex());
            if (const request_state * r = request_of_task_locked(task_id)) {
                id = r->id;
            }
        }
        llama_instr_set_seq_request(ctx, slot, id.c_str());
    } catch (...) {
        host_lost();
    }
}

// The slot lets the task go: when it sampled its last token (server_slot_stats::t_gen_last, us).
// Before request_released, which may write the record.
inline void host_released(int task_id, int64_t t_gen_last_us) noexcept {
    if (!active()) {
        return;
    }
    try {
        std::lock_guard<std::mutex> lock(requests_mutex());
        request_state *             r = request_of_task_locked(task_id);
        if (!r) {
            return;
        }
        if (r->task == task_id) {
            host_of_locked(*r).t_last_token_us = t_gen_last_us;
        } else if (task_state * k = task_of_locked(*r, task_id)) {
            k->t_last_us = t_gen_last_us;
        }
    } catch (...) {
        host_lost();
    }
}

// A part of the host's work for sequence `seq` of `ctx` (-1: for no slot in particular), timed
// from its making to its end.
struct host_timer {
    host_timer(llama_context * ctx, int seq, const char * name) :
        ctx(ctx),
        seq(seq),
        name(name),
        t_start(llama_instr_host_clock()) {}

    ~host_timer() { llama_instr_host_part(ctx, seq, name, t_start); }

    host_timer(const host_timer &)             = delete;
    host_timer & operator=(const host_timer &) = delete;

    llama_context * const ctx;
    const int             seq;
    const char * const    name;
    const int64_t         t_start;
};

// Tokens a slot's sampler chain accepts outside any sampling (the prompt's, before the first token
// is sampled), for the slot's sequence.
struct sampling_scope {
    sampling_scope(llama_context * ctx, int seq, const llama_sampler * chain) :
        handle(llama_instr_sample_begin_seq(ctx, seq, chain)) {}

    ~sampling_scope() { llama_instr_sample_end(handle); }

    sampling_scope(const sampling_scope &)             = delete;
    sampling_scope & operator=(const sampling_scope &) = delete;

    const int64_t handle;
};

// the request whose chunk this HTTP thread writes next (host_sending, then host_sent)
inline request_ptr & sending_request() {
    static thread_local request_ptr r;
    return r;
}

// The stream of `t` makes its next chunk on this thread (its response's next()).
inline void host_sending(const request_tracker & t) noexcept {
    sending_request() = t ? t->r : nullptr;
}

// One call of a stream's content provider on the HTTP thread: whatever request its next() named
// is forgotten when it returns, written or not (a stream's last call makes no chunk, and the
// thread's next stream may be one whose next() names none: a replayed conversation).
struct send_scope {
    send_scope() noexcept = default;

    ~send_scope() { sending_request().reset(); }

    send_scope(const send_scope &)             = delete;
    send_scope & operator=(const send_scope &) = delete;
};

// The log's clock when a session records, else 0: before writing a chunk to the connection.
inline int64_t host_clock() {
    return llama_instr_host_clock();
}

// The chunk was written (or failed to be), from `t_start` (host_clock) until now: the request's
// time sending. Called inside cpp-httplib's content provider, which nothing may leave.
inline void host_sent(int64_t t_start) noexcept {
    request_ptr r = std::move(sending_request());
    sending_request().reset();
    if (!r || !t_start) {
        return;
    }
    const int64_t t = now_ns();
    try {
        std::lock_guard<std::mutex> lock(requests_mutex());
        host_totals &               h = host_of_locked(*r);
        h.send_ns += t - t_start;
        h.sends++;
    } catch (...) {
        host_lost();
    }
}

}  // namespace llama_instr_tools
