#pragma once

// llamacpp-instr: what llama.cpp's own programs add to a session that LLAMA_INSTR_LOG opened
// (src/llama-instr-env.cpp): llama-server's requests as `request` records (every one, whatever
// became of it), llama-bench's tests as `part` records (docs/schema.md). Header-only, on the public API of llama-instr.h; with no
// session open each call is one call to llama_instr_get_level().

#include "llama-instr.h"

#include <strings.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace llama_instr_tools {

inline bool active() {
    return llama_instr_get_level() != LLAMA_INSTR_LEVEL_OFF;
}

// the log's clock (CLOCK_MONOTONIC, ns), the clock ggml_time_us() reads too
inline int64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// a JSON string of plain text (paths, labels): quotes, backslashes and control bytes escaped
inline std::string json_str(const std::string & v) {
    std::string out = "\"";
    for (unsigned char c : v) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

inline std::string json_int_or_null(bool known, int64_t v) {
    return known ? std::to_string(v) : "null";
}

// --- llama-server ------------------------------------------------------------------------------
//
// One `request` record per completion request, whatever became of it: "ok", "error" (with its HTTP
// status) or "cancelled" (the client went away; a stream says how many tokens it was sent). Half of
// what the record says is known on the HTTP side (handle_completions_impl and the stream it
// returns, on the connection's thread): arrival, outcome, status, tokens sent. The other half on
// the slot side (the server's thread): which slot ran it, when, and the tokens it decoded. Each
// side fills its half of a shared request_state; whichever finishes last writes the record. The
// states live from arrival to the record: memory is bounded by the requests in flight.

struct spec_totals;  // its speculative decoding (llama-instr-spec.h)
struct host_totals;  // the host's work for it (llama-instr-host.h)

// One of a request's tasks after its first: another of its prompts, or another completion of a
// prompt (n_cmpl > 1: a child task, whose slot takes its parent's prompt as a copy of the
// parent's cells, server_slot::copy_state_to). The slot side's half, as the record's first task has it.
struct task_state {
    int      id         = -1;
    int      index      = 0;   // its place among the request's tasks: its result's index in the response
    int      parent     = -1;  // a child's parent task
    int      slot       = -1;
    int64_t  t_start_us = 0;   // as request_state's (a child's are its parent's: its statistics are a copy)
    int64_t  t_first_us = 0;
    int64_t  t_last_us  = 0;   // when it sampled its last token
    int64_t  t_released = 0;
    uint64_t n_prompt   = 0;   // prompt tokens decoded on its own sequence (a child's: none)
    uint64_t n_gen      = 0;
};

struct request_state {
    std::string id;             // "task-<its first task id>"
    std::string endpoint;
    std::string traceparent;    // an incoming W3C trace context, when well formed
    int64_t     t_arrive = 0;
    int         task     = -1;  // its first task: the one whose slot statistics the record gives

    // its other tasks, in the order they were made (their index), at most MAX_TASKS of them
    static constexpr size_t MAX_TASKS = 256;
    std::vector<task_state> tasks;
    int                     n_tasks = 0;    // tasks made, its first included
    std::vector<int64_t>    sent_by_index;  // tokens the client was sent of each task's results

    // the HTTP side
    bool         http_done = false;
    bool         stream    = false;
    int          status    = 0;
    const char * outcome   = "cancelled";
    std::string  error;
    int64_t      t_end        = 0;
    int64_t      t_first_sent = 0;  // when the first token was sent (streams)
    int64_t      tokens_sent  = 0;  // tokens the client was sent (streams), of all its tasks

    // the slot side
    int      running    = 0;   // its tasks on a slot now
    int      slot       = -1;  // the slot (its sequence id in the steps' seqs) of its first task
    int      level      = 0;   // the level its steps were recorded at (sampling)
    int64_t  t_start_us = 0;   // when the slot began the prompt (ggml_time_us: the log's clock, in us)
    int64_t  t_first_us = 0;   // when the slot sampled the first token
    int64_t  t_released = 0;   // when the slot let it go
    uint64_t n_prompt   = 0;   // prompt tokens decoded (after the prompt cache)
    uint64_t n_gen      = 0;   // tokens sampled
    bool     written    = false;

    // the prompt cache when the slot began the prompt (request_prompt): what was reused, and what
    // was not and why (the converters name the reason from these facts)
    const char * slot_by      = nullptr;  // how the server chose the slot: "id", "similarity", "lru"
    bool         cache_known  = false;
    bool         cache_prompt = true;     // the request let the server reuse its cache
    int64_t      n_prompt_all = 0;        // the prompt's tokens
    int64_t      n_held       = 0;        // tokens the slot's cache held
    int64_t      n_common     = 0;        // of those, the prefix in common with the prompt
    int64_t      n_reused     = 0;        // tokens reused (the server's n_past)
    int          other_slot   = -1;       // another slot whose cache held a longer common prefix
    int64_t      other_common = 0;
    int64_t      seen_tokens  = 0;        // a prefix at least this long was the prompt of an earlier request
    std::string  seen_request;            // ... that one
    std::string  text_before;             // where the slot's cache and the prompt diverged: the text before
    std::string  text_held;               // ... the cache's text after
    std::string  text_prompt;             // ... the prompt's text after

    std::shared_ptr<spec_totals> spec;    // the drafts it verified (none: null)
    std::shared_ptr<host_totals> host;    // its last token, its chunks sent (none: null)

    // what a replay sends again and checks (DETAILED, llama-server; llama-instr-body.h): the body as
    // the client sent it, each medium by its hash and size, and the tokens its first task sampled
    static constexpr size_t MAX_GEN_IDS = 16384;
    std::string             body;                     // JSON as recorded, or "": not kept
    const char *            body_left_out = nullptr;  // why it was not: "size", "not_json"
    int64_t                 body_bytes    = 0;        // its size as received
    bool                    keep_ids      = false;    // its tokens are recorded (the level)
    std::vector<int32_t>    gen_ids;                  // at most MAX_GEN_IDS
    int64_t                 gen_ids_left_out = 0;
};

using request_ptr = std::shared_ptr<request_state>;

inline std::mutex & requests_mutex() {
    static std::mutex m;
    return m;
}

// task id -> its request, from arrival to the record
inline std::unordered_map<int, request_ptr> & requests_by_task() {
    static std::unordered_map<int, request_ptr> m;
    return m;
}

// error messages go into the log as plain printable ASCII, at most 200 bytes
inline std::string error_text(const std::string & e) {
    std::string out;
    for (unsigned char c : e) {
        if (out.size() >= 200) {
            break;
        }
        out += c >= 0x20 && c < 0x7f ? (char) c : ' ';
    }
    return out;
}

inline std::string spec_fields(const request_state & r);  // llama-instr-spec.h
inline std::string host_fields(const request_state & r);  // llama-instr-host.h

// "wait", "ttft" and "model" of a task that arrived at t_arrive, from its slot's statistics (us)
// and its release (ns); `t_first_sent`, when its first token was sent, stands for a first token
// the slot never said (a stream cancelled first)
inline std::string slot_times(int64_t t_arrive,
                              int64_t t_start_us,
                              int64_t t_first_us,
                              int64_t t_released,
                              int64_t t_first_sent) {
    const int64_t t_model = t_start_us > 0 ? t_start_us * 1000 : 0;
    const int64_t t_first = t_first_us > 0 ? t_first_us * 1000 : t_first_sent;
    const bool    waited  = t_model >= t_arrive && t_model > 0;
    std::string   f       = ",\"wait\":" + json_int_or_null(waited, t_model - t_arrive);
    f += ",\"ttft\":" + json_int_or_null(t_first > 0 && t_first >= t_arrive, t_first - t_arrive);
    f += ",\"model\":" + json_int_or_null(waited && t_released >= t_model, t_released - t_model);
    return f;
}

// the request's tasks after its first, each as the record gives its first ("tasks"), or ""
inline std::string tasks_fields(const request_state & r) {
    if (r.tasks.empty()) {
        return "";
    }
    std::string f = ",\"tasks\":[";
    for (const task_state & k : r.tasks) {
        f += &k == &r.tasks.front() ? "{" : ",{";
        f += "\"id\":" + json_str("task-" + std::to_string(k.id)) + ",\"index\":" + std::to_string(k.index);
        if (k.parent >= 0) {
            f += ",\"parent\":" + json_str("task-" + std::to_string(k.parent));
        }
        if (k.slot >= 0) {
            f += ",\"slot\":" + std::to_string(k.slot);
        }
        f += slot_times(r.t_arrive, k.t_start_us, k.t_first_us, k.t_released, 0);
        f += ",\"prompt_tokens\":" + std::to_string(k.n_prompt);
        f += ",\"gen_tokens\":" + std::to_string(k.n_gen > 0 ? k.n_gen - 1 : 0);
        const int64_t t_last = k.t_last_us * 1000;
        if (k.t_last_us > 0 && t_last >= r.t_arrive) {
            f += ",\"last_token\":" + std::to_string(t_last - r.t_arrive);
        }
        f += "}";
    }
    f += "]";
    if (r.n_tasks > (int) r.tasks.size() + 1) {
        f += ",\"tasks_left_out\":" + std::to_string(r.n_tasks - (int) r.tasks.size() - 1);
    }
    return f;
}

// The fields a replay reads: the body (or why it is not there) and the tokens sampled.
inline std::string replay_fields(const request_state & r) {
    std::string f;
    if (!r.body.empty()) {
        f += ",\"body\":" + r.body;
    } else if (r.body_left_out) {
        f += ",\"body_left_out\":" + json_str(r.body_left_out);
    }
    if (r.body_bytes > 0) {
        f += ",\"body_bytes\":" + std::to_string(r.body_bytes);
    }
    if (r.keep_ids) {
        f += ",\"gen_ids\":[";
        for (size_t i = 0; i < r.gen_ids.size(); i++) {
            f += (i ? "," : "") + std::to_string(r.gen_ids[i]);
        }
        f += "]";
        if (r.gen_ids_left_out > 0) {
            f += ",\"gen_ids_left_out\":" + std::to_string(r.gen_ids_left_out);
        }
    }
    return f;
}

inline std::string request_fields(const request_state & r) {
    std::string f = "{\"id\":" + json_str(r.id);
    f += ",\"endpoint\":" + json_str(r.endpoint);
    f += ",\"method\":\"POST\",\"status\":" + std::to_string(r.status);
    if (!r.traceparent.empty()) {
        f += ",\"traceparent\":" + json_str(r.traceparent);
    }
    f += ",\"outcome\":" + json_str(r.outcome);
    if (!r.error.empty()) {
        f += ",\"error\":" + json_str(error_text(r.error));
    }
    f += ",\"stream\":";
    f += r.stream ? "true" : "false";
    f += ",\"t_arrive\":" + std::to_string(r.t_arrive);
    f += slot_times(r.t_arrive, r.t_start_us, r.t_first_us, r.t_released, r.t_first_sent);
    // done: the response finished and the slots let its tasks go (whichever came last)
    int64_t t_done = r.t_released > r.t_end ? r.t_released : r.t_end;
    for (const task_state & k : r.tasks) {
        t_done = k.t_released > t_done ? k.t_released : t_done;
    }
    f += ",\"dur\":" + std::to_string(t_done >= r.t_arrive ? t_done - r.t_arrive : 0);
    f += ",\"prompt_tokens\":" + std::to_string(r.n_prompt);
    // the last token sampled is never decoded (the slot stops on it)
    f += ",\"gen_tokens\":" + std::to_string(r.n_gen > 0 ? r.n_gen - 1 : 0);
    if (r.stream) {
        f += ",\"tokens_sent\":" + std::to_string(r.tokens_sent);
    }
    if (r.slot >= 0) {
        f += ",\"slot\":" + std::to_string(r.slot);
    }
    if (r.level > 0) {
        static const char * const names[] = { "off", "minimal", "detailed", "verbose" };
        f += ",\"level\":" + json_str(names[r.level < 4 ? r.level : 3]);
    }
    if (r.cache_known) {
        f += ",\"cache\":{\"prompt\":" + std::to_string(r.n_prompt_all);
        f += ",\"enabled\":";
        f += r.cache_prompt ? "true" : "false";
        if (r.slot_by) {
            f += ",\"slot_by\":" + json_str(r.slot_by);
        }
        f += ",\"held\":" + std::to_string(r.n_held) + ",\"common\":" + std::to_string(r.n_common);
        f += ",\"reused\":" + std::to_string(r.n_reused);
        if (r.other_slot >= 0) {
            f += ",\"other_slot\":" + std::to_string(r.other_slot);
            f += ",\"other_common\":" + std::to_string(r.other_common);
        }
        if (r.seen_tokens > 0) {
            f += ",\"seen\":{\"tokens\":" + std::to_string(r.seen_tokens);
            f += ",\"request\":" + json_str(r.seen_request) + "}";
        }
        if (r.n_common < r.n_held && r.n_common < r.n_prompt_all) {
            f += ",\"diverged\":{\"at\":" + std::to_string(r.n_common);
            f += ",\"before\":" + json_str(r.text_before) + ",\"held\":" + json_str(r.text_held);
            f += ",\"prompt\":" + json_str(r.text_prompt) + "}";
        }
        f += "}";
    }
    return f + tasks_fields(r) + spec_fields(r) + host_fields(r) + replay_fields(r) + "}";
}

// With requests_mutex() held: the record's fields once both sides are done (and not before, nor
// twice), or "".
inline std::string finish_locked(request_state & r) {
    if (!r.http_done || r.running > 0 || r.written) {
        return "";
    }
    r.written = true;
    auto & m  = requests_by_task();
    for (auto it = m.begin(); it != m.end();) {
        it = it->second.get() == &r ? m.erase(it) : std::next(it);
    }
    return request_fields(r);
}

inline void write_request(const std::string & fields) {
    if (fields.empty()) {
        return;
    }
    const int32_t rc = llama_instr_write_record("request", fields.c_str());
    if (rc != LLAMA_INSTR_OK && rc != LLAMA_INSTR_ERR_NO_SESSION) {
        // refused (the session counts it lost): said once, as the session's other warnings
        static std::atomic<bool> said{ false };
        if (!said.exchange(true)) {
            fprintf(stderr, "llama-instr: a request record was refused (%s): it is counted as lost\n",
                    llama_instr_last_error());
        }
    }
    llama_instr_flush();  // the server may now idle: a follower sees the request at once
}

// The HTTP side's hold on one request. Its last copy going away without request_end means the
// client went away (the stream was dropped): "cancelled".
struct request_handle {
    request_ptr r;
    int         uncaught = std::uncaught_exceptions();

    ~request_handle();
};

using request_tracker = std::shared_ptr<request_handle>;

// a handler that threw: its request, completed by request_failed (ex_wrapper, same thread)
inline request_ptr & unwound_request() {
    static thread_local request_ptr r;
    return r;
}

inline request_handle::~request_handle() {
    // Nothing may leave a destructor (std::terminate would end the server): a failure here (the
    // lock's std::system_error, std::bad_alloc making the record) loses the record, counted as
    // lost as a refused one is.
    try {
        std::string fields;
        {
            std::lock_guard<std::mutex> lock(requests_mutex());
            if (r->http_done) {
                return;
            }
            if (std::uncaught_exceptions() > uncaught) {
                unwound_request() = r;  // the handler threw: request_failed says how it ended
                return;
            }
            r->http_done = true;
            r->t_end     = now_ns();
            // a stream had sent its headers; a plain response was never sent (nginx's 499)
            r->status    = r->stream ? 200 : 499;
            fields       = finish_locked(*r);
        }
        write_request(fields);
    } catch (...) {
        llama_instr_write_record("request", nullptr);  // refused: one record counted lost
    }
}

// A W3C `traceparent` header's value when it is well formed (version 00: "00-" 32 lowercase hex
// digits of trace id "-" 16 of parent id "-" 2 of flags, neither id all zeros), else "". The
// header is the client's: nothing else of it reaches the log.
inline std::string valid_traceparent(const std::string & v) {
    if (v.size() != 55 || v.compare(0, 3, "00-") != 0 || v[35] != '-' || v[52] != '-') {
        return "";
    }
    bool zero_trace = true;
    bool zero_span  = true;
    for (size_t i = 3; i < 55; i++) {
        if (i == 35 || i == 52) {
            continue;
        }
        const char c = v[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return "";
        }
        zero_trace = zero_trace && (i >= 35 || c == '0');
        zero_span  = zero_span && (i < 36 || i >= 52 || c == '0');
    }
    return zero_trace || zero_span ? "" : v;
}

// A completion request arrived (handle_completions_impl), with its HTTP headers; nullptr with no
// session open.
inline request_tracker request_begin(const std::string & endpoint, const std::map<std::string, std::string> & headers) {
    if (!active()) {
        return nullptr;
    }
    auto r      = std::make_shared<request_state>();
    r->endpoint = endpoint;
    for (const auto & [key, value] : headers) {
        if (key.size() == 11 && strncasecmp(key.c_str(), "traceparent", 11) == 0) {
            r->traceparent = valid_traceparent(value);
        }
    }
    r->t_arrive = now_ns();
    auto h      = std::make_shared<request_handle>();
    h->r        = r;
    return h;
}

// It became the server task `task_id` (a request with several prompts becomes several tasks), or
// one of them had the child task `task_id` of the parent task `parent_id` (n_cmpl > 1: a further
// completion of its prompt). Called in the order the server numbers their results (each task, then
// its children), so that a task's place in that order is its result's index.
inline void request_task(const request_tracker & t, int task_id, int parent_id = -1) {
    if (!t) {
        return;
    }
    std::lock_guard<std::mutex> lock(requests_mutex());
    auto &                      m = requests_by_task();
    if (m.size() >= 4096) {
        // states whose slot never released them (a server that dropped a task): never written
        for (auto it = m.begin(); it != m.end();) {
            it = it->second->http_done ? m.erase(it) : std::next(it);
        }
    }
    request_state & r = *t->r;
    if (r.task < 0) {
        r.task = task_id;
        r.id   = "task-" + std::to_string(task_id);
    } else if (r.tasks.size() < request_state::MAX_TASKS) {
        task_state k;
        k.id     = task_id;
        k.index  = r.n_tasks;
        k.parent = parent_id;
        r.tasks.push_back(k);
    }
    r.n_tasks++;
    m[task_id] = t->r;
}

// With requests_mutex() held: the request the task `task_id` is of, or nullptr (none is tracked:
// it arrived before the session, or its record was written)
inline request_state * request_of_task_locked(int task_id) {
    auto & m  = requests_by_task();
    auto   it = m.find(task_id);
    return it != m.end() ? it->second.get() : nullptr;
}

// With requests_mutex() held: the task `task_id` of r after its first, or nullptr (its first, or
// one past MAX_TASKS)
inline task_state * task_of_locked(request_state & r, int task_id) {
    for (task_state & k : r.tasks) {
        if (k.id == task_id) {
            return &k;
        }
    }
    return nullptr;
}

// A chunk of its stream was sent: `partial` (a server_task_result_cmpl_partial, or nullptr for
// another result) says how many tokens were decoded for it so far.
template <class R> inline void request_sent(const request_tracker & t, const R * partial) {
    if (!t) {
        return;
    }
    std::lock_guard<std::mutex> lock(requests_mutex());
    request_state &             r = *t->r;
    r.stream                      = true;
    // each task's results say its own tokens so far: the request's are their sum
    const size_t i                = partial ? (size_t) partial->index : 0;
    if (partial && i <= request_state::MAX_TASKS) {
        if (r.sent_by_index.size() <= i) {
            r.sent_by_index.resize(i + 1, 0);
        }
        const int64_t n = (int64_t) partial->n_decoded;
        if (n > r.sent_by_index[i]) {
            if (r.tokens_sent == 0) {
                r.t_first_sent = now_ns();
            }
            r.tokens_sent += n - r.sent_by_index[i];
            r.sent_by_index[i] = n;
        }
    }
}

// The HTTP side is done with it: `outcome` "ok" or "error" (with `error`, what went wrong), and the
// HTTP status it answered with.
inline void request_end(const request_tracker & t, int status, const char * outcome, const std::string & error = "") {
    if (!t) {
        return;
    }
    std::string fields;
    {
        std::lock_guard<std::mutex> lock(requests_mutex());
        request_state &             r = *t->r;
        if (r.http_done) {
            return;
        }
        r.http_done = true;
        r.t_end     = now_ns();
        r.status    = status;
        r.outcome   = outcome;
        r.error     = error;
        fields      = finish_locked(r);
    }
    write_request(fields);
}

// A handler threw before answering (ex_wrapper): the request it was handling on this thread (or a
// new one, e.g. a malformed body that never reached handle_completions_impl) ends as an error.
inline std::string utf8_text(const std::string & raw, size_t max);

inline void request_failed(const std::string & endpoint, int status, const std::string & error) {
    request_ptr r = std::move(unwound_request());
    unwound_request().reset();
    if (!active()) {
        return;
    }
    if (!r) {
        static std::atomic<int64_t> n_failed{ 0 };
        r           = std::make_shared<request_state>();
        r->id       = "failed-" + std::to_string(++n_failed);
        // httplib's path, percent-decoded: any bytes the client sent (`/slots/0%FF`), as text
        r->endpoint = utf8_text(endpoint, 200);
        r->t_arrive = now_ns();
    }
    std::string fields;
    {
        std::lock_guard<std::mutex> lock(requests_mutex());
        if (r->http_done) {
            return;
        }
        r->http_done = true;
        r->t_end     = now_ns();
        r->status    = status;
        r->outcome   = "error";
        r->error     = error;
        fields       = finish_locked(*r);
    }
    write_request(fields);
}

// The slot `slot` (its sequence id in the steps' seqs) of `ctx` began the task `task_id`: its
// steps are sampled with it (--sample-requests).
inline void request_launched(llama_context * ctx, int task_id, int slot) {
    if (!active()) {
        return;
    }
    const int32_t               level = llama_instr_request_begin(ctx, slot);
    std::lock_guard<std::mutex> lock(requests_mutex());
    request_state *             rp = request_of_task_locked(task_id);
    if (!rp || rp->written) {
        return;  // arrived before the session, or already recorded (cancelled while queued)
    }
    request_state & r = *rp;
    r.running++;
    if (task_id == r.task) {
        r.slot  = slot;
        r.level = level > 0 ? level : 0;
    } else if (task_state * k = task_of_locked(r, task_id)) {
        k->slot = slot;
    }
}

// The slot let the task go (done, failed or cancelled), with its statistics: when it began the
// prompt and sampled the first token (ggml_time_us), prompt tokens decoded, tokens sampled.
inline void request_released(llama_context * ctx,
                             int             task_id,
                             int             slot,
                             int64_t         t_start_us,
                             int64_t         t_first_us,
                             uint64_t        n_prompt_processed,
                             uint64_t        n_gen) {
    if (!active()) {
        return;
    }
    llama_instr_request_end(ctx, slot);
    std::string fields;
    {
        std::lock_guard<std::mutex> lock(requests_mutex());
        auto &                      m  = requests_by_task();
        auto                        it = m.find(task_id);
        if (it == m.end()) {
            return;
        }
        request_ptr r = it->second;
        if (r->running > 0) {
            r->running--;
        }
        if (task_id == r->task) {
            r->t_start_us = t_start_us;
            r->t_first_us = t_first_us;
            r->t_released = now_ns();
            r->n_prompt   = n_prompt_processed;
            r->n_gen      = n_gen;
        } else if (task_state * k = task_of_locked(*r, task_id)) {
            k->t_start_us = t_start_us;
            k->t_first_us = t_first_us;
            k->t_released = now_ns();
            // a child's statistics are its parent's copied with its prompt's cells: it decoded none
            k->n_prompt   = k->parent >= 0 ? 0 : n_prompt_processed;
            k->n_gen      = n_gen;
        }
        fields = finish_locked(*r);
    }
    write_request(fields);
}

// The slot of task `task_id` sampled `token` (process_token): kept for the request's first task,
// when its record keeps its tokens.
inline void request_token(int task_id, int32_t token) noexcept {
    if (!active()) {
        return;
    }
    try {
        std::lock_guard<std::mutex> lock(requests_mutex());
        request_state *             r = request_of_task_locked(task_id);
        if (!r || r->task != task_id || !r->keep_ids) {
            return;
        }
        if (r->gen_ids.size() < request_state::MAX_GEN_IDS) {
            r->gen_ids.push_back(token);
        } else {
            r->gen_ids_left_out++;
        }
    } catch (...) {
        // out of memory: the record says fewer tokens than were sampled (the replay's check fails)
    }
}

// The server chose `slot` for the task `task_id` (get_available_slot): `how` is "id" (the request
// named it), "similarity" (its cache held enough of the prompt) or "lru" (the least recently used).
inline void request_slot_chosen(int task_id, const char * how) {
    if (!active()) {
        return;
    }
    std::lock_guard<std::mutex> lock(requests_mutex());
    if (request_state * r = request_of_task_locked(task_id)) {
        r->slot_by = how;
    }
}

// Length of the well-formed UTF-8 sequence at raw[i] (1..4), or 0 if none starts there: Unicode's
// table 3-7, which excludes overlong forms, surrogates and code points above U+10FFFF (the JSON
// checker of llama_instr_write_record refuses a record holding any of them).
inline size_t utf8_len(const std::string & raw, size_t i) {
    const unsigned char c = (unsigned char) raw[i];
    if (c < 0x80) {
        return 1;
    }
    size_t        len = 0;
    unsigned char lo  = 0x80;  // the second byte's range
    unsigned char hi  = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo  = c == 0xE0 ? 0xA0 : 0x80;  // E0 80..9F would be overlong
        hi  = c == 0xED ? 0x9F : 0xBF;  // ED A0..BF would be a surrogate
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo  = c == 0xF0 ? 0x90 : 0x80;  // F0 80..8F would be overlong
        hi  = c == 0xF4 ? 0x8F : 0xBF;  // F4 90.. would be above U+10FFFF
    } else {
        // a continuation byte, C0/C1 (overlong) or F5..FF
        return 0;
    }
    if (raw.size() - i < len || (unsigned char) raw[i + 1] < lo || (unsigned char) raw[i + 1] > hi) {
        return 0;
    }
    for (size_t k = 2; k < len; k++) {
        if (((unsigned char) raw[i + k] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return len;
}

// raw bytes as text: well-formed UTF-8 kept, every other byte as '?', up to `max` bytes (the
// character that reaches it kept whole)
inline std::string utf8_text(const std::string & raw, size_t max) {
    std::string out;
    for (size_t i = 0; i < raw.size() && out.size() < max;) {
        const size_t len = utf8_len(raw, i);
        if (len == 0) {
            out += '?';
            i++;
        } else {
            out.append(raw, i, len);
            i += len;
        }
    }
    return out;
}

// tokens [i0, i1) of `t` as text (utf8_text), at most about `max` bytes
inline std::string tokens_text(llama_context *                  ctx,
                               const std::vector<llama_token> & t,
                               int64_t                          i0,
                               int64_t                          i1,
                               size_t                           max = 120) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    std::string         raw;
    for (int64_t i = i0 < 0 ? 0 : i0; i < i1 && i < (int64_t) t.size() && raw.size() < 4 * max; i++) {
        char      buf[64];
        const int n = t[i] == LLAMA_TOKEN_NULL ? -1 : llama_token_to_piece(vocab, t[i], buf, sizeof(buf), 0, true);
        raw += n > 0 ? std::string(buf, (size_t) n) : std::string("[media]");
    }
    return utf8_text(raw, max);
}

// The prompts of earlier requests, as hashes of their first 16, 32, 64, ... tokens: a prompt whose
// start was computed before, and that no cache held any more, was evicted. Bounded: the oldest
// entries go first.
struct prefix_history {
    std::unordered_map<uint64_t, std::string> by_hash;  // hash of a prefix (and its length) -> request
    std::vector<uint64_t>                     order;    // ring of the keys, oldest at `next`
    size_t                                    next = 0;
    static constexpr size_t                   MAX  = 16384;

    static uint64_t step(uint64_t h, llama_token t) { return (h ^ (uint32_t) t) * 1099511628211ull; }

    // the longest prefix of `prompt` that an earlier request's prompt began with; then remember this
    // one. A prefix ends at the prompt's first medium (its position holds no token to compare).
    int64_t seen_then_add(const std::vector<llama_token> & prompt, const std::string & id, std::string & who) {
        int64_t               best = 0;
        uint64_t              h    = 14695981039346656037ull;
        std::vector<uint64_t> mine;
        for (size_t i = 0, len = 16; i < prompt.size() && prompt[i] != LLAMA_TOKEN_NULL; i++) {
            h = step(h, prompt[i]);
            if (i + 1 == len) {
                const uint64_t key = step(h, (llama_token) len);
                auto           it  = by_hash.find(key);
                if (it != by_hash.end() && it->second != id) {
                    best = (int64_t) len;
                    who  = it->second;
                }
                mine.push_back(key);
                len *= 2;
            }
        }
        for (uint64_t key : mine) {
            if (order.size() < MAX) {
                order.push_back(key);
            } else {
                by_hash.erase(order[next]);
                order[next] = key;
                next        = (next + 1) % MAX;
            }
            by_hash[key] = id;
        }
        return best;
    }
};

// A prompt's tokens, whatever it holds (server_tokens::get_tokens refuses one with images or
// sounds): a medium's positions are LLAMA_TOKEN_NULL.
template <class Tokens> std::vector<llama_token> token_ids(const Tokens & t) {
    std::vector<llama_token> ids(t.size());
    for (size_t i = 0; i < ids.size(); i++) {
        ids[i] = t[i];
    }
    return ids;
}

// The slot `slot_id` begins the prompt of `task_id` (update_slots, where the server decided how much
// of its cache to keep): `held`, what its cache held; `prompt`, the prompt; `n_reused`, the tokens
// it keeps (n_past); `slots`, every slot (another one may have held more of the prompt). Prefixes
// in common are the server's own (server_tokens::get_common_prefix, media chunks included).
template <class Tokens, class Slots>
inline void request_prompt(llama_context * ctx,
                           int             task_id,
                           int             slot_id,
                           const Tokens &  held,
                           const Tokens &  prompt,
                           int64_t         n_reused,
                           bool            cache_prompt,
                           const Slots &   slots) {
    if (!active()) {
        return;
    }
    int     other        = -1;
    int64_t other_common = 0;
    for (const auto & s : slots) {
        if (s.id != slot_id) {
            const int64_t c = (int64_t) s.prompt.tokens.get_common_prefix(prompt);
            if (c > other_common) {
                other        = s.id;
                other_common = c;
            }
        }
    }
    const int64_t               common = (int64_t) held.get_common_prefix(prompt);
    std::lock_guard<std::mutex> lock(requests_mutex());
    request_state *             rp = request_of_task_locked(task_id);
    if (!rp || rp->task != task_id) {
        return;
    }
    static prefix_history history;
    request_state &       r = *rp;
    r.cache_known           = true;
    r.cache_prompt          = cache_prompt;
    r.n_prompt_all          = (int64_t) prompt.size();
    r.n_held                = (int64_t) held.size();
    r.n_common              = common;
    r.n_reused              = n_reused;
    if (other_common > common) {
        r.other_slot   = other;
        r.other_common = other_common;
    }
    const std::vector<llama_token> ids = token_ids(prompt);
    r.seen_tokens                      = history.seen_then_add(ids, r.id, r.seen_request);
    if (common < r.n_held && common < r.n_prompt_all) {
        r.text_before = tokens_text(ctx, ids, common - 8, common);
        r.text_held   = tokens_text(ctx, token_ids(held), common, common + 8);
        r.text_prompt = tokens_text(ctx, ids, common, common + 8);
    }
}

// --- llama-bench -------------------------------------------------------------------------------

struct part_state {
    std::string label;
    int64_t     t_start = 0;
};

inline part_state & current_part() {
    static part_state p;
    return p;
}

// A labelled part of the run begins (a llama-bench test: "pp512", "tg128", "pp512+tg128 @ d512"):
// the steps `ctx` decodes until part_end carry the label as their `request`.
inline void part_begin(llama_context * ctx, int n_prompt, int n_gen, int n_depth) {
    if (!active()) {
        return;
    }
    std::string label;
    if (n_prompt > 0 && n_gen == 0) {
        label = "pp" + std::to_string(n_prompt);
    } else if (n_gen > 0 && n_prompt == 0) {
        label = "tg" + std::to_string(n_gen);
    } else {
        label = "pp" + std::to_string(n_prompt) + "+tg" + std::to_string(n_gen);
    }
    if (n_depth > 0) {
        label += " @ d" + std::to_string(n_depth);
    }
    current_part() = { label, now_ns() };
    llama_instr_set_request(ctx, label.c_str());
}

// The part ends: its `part` record (label, start, duration, the program's repetitions and the
// ns each took as it measured them).
inline void part_end(llama_context * ctx, const char * program, const std::string & samples_ns) {
    part_state & p = current_part();
    if (!active() || p.label.empty()) {
        return;
    }
    const int64_t t_end = now_ns();
    std::string   f     = "{\"label\":" + json_str(p.label) + ",\"program\":" + json_str(program);
    f += ",\"t_start\":" + std::to_string(p.t_start) + ",\"dur\":" + std::to_string(t_end - p.t_start);
    f += ",\"samples_ns\":[" + samples_ns + "]}";
    llama_instr_write_record("part", f.c_str());
    llama_instr_set_request(ctx, nullptr);
    p.label.clear();
}

}  // namespace llama_instr_tools

#include "llama-instr-host.h"  // llama-server's work between steps
#include "llama-instr-spec.h"  // llama-server's speculative decoding
