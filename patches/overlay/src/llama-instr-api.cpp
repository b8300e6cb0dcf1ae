#include "llama-instr-graph.h"
#include "llama-instr-hooks.h"
#include "llama-instr-memory.h"
#include "llama-instr-model.h"
#include "llama-instr-peaks.h"
#include "llama-instr-registry.h"
#include "llama-instr-rpc.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <string>

#if !defined(_WIN32)
#    include <unistd.h>
#endif

// both defined by the build (instr build passes them; see patches/0002)
#ifndef LLAMA_INSTR_PATCH_HASH
#    define LLAMA_INSTR_PATCH_HASH "dev"
#endif
#ifndef LLAMA_INSTR_LLAMA_COMMIT
#    define LLAMA_INSTR_LLAMA_COMMIT "unknown"
#endif

using namespace llama_instr;

namespace {

// A plain buffer, not a std::string: a thread's thread_local objects are destroyed before the
// atexit handlers run, and the session LLAMA_INSTR_LOG opened ends in one (a failed end reports
// here). A buffer has no destructor, so it stays valid for them.
thread_local char t_last_error[512];

int32_t api_error(int32_t code, const char * msg) noexcept {
    snprintf(t_last_error, sizeof(t_last_error), "%s", msg ? msg : "");
    return code;
}

int32_t api_error(int32_t code, const std::string & msg) noexcept {
    return api_error(code, msg.c_str());
}

// sid: 16 hex digits; wall clock in ISO 8601 UTC with microseconds
void new_ids(std::string & sid, char (&wall)[64], std::string & default_name) {
    std::random_device rd;
    char               b[17];
    snprintf(b, sizeof(b), "%08x%08x", (unsigned) rd(), (unsigned) rd());
    sid = b;

    const auto        now = std::chrono::system_clock::now();
    const std::time_t tt  = std::chrono::system_clock::to_time_t(now);
    std::tm           ut = {}, lt = {};
#if defined(_WIN32)
    gmtime_s(&ut, &tt);
    localtime_s(&lt, &tt);
#else
    gmtime_r(&tt, &ut);
    localtime_r(&tt, &lt);
#endif
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &ut);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
    snprintf(wall, sizeof(wall), "%s.%06lldZ", date, (long long) us);
    char name[64];
    strftime(name, sizeof(name), "llama_instrumentation_%Y%m%d_%H%M%S.log", &lt);
    default_name = name;
}

// The smallest file size rotation takes (a file holds at least session_start and one step).
constexpr int64_t k_min_rotate_bytes = 64 * 1024;

// Sequence ids llama_instr_request_begin takes: 0 .. k_max_seq - 1.
constexpr int32_t k_max_seq = 65536;

// Keys a caller's record must not hold: record_head writes them.
const char * const RESERVED_KEYS[] = { "type", "ts", "sid" };

// A new session's state: its id and clock, its counters at zero, and the sampling and rotation the
// next session was given.
void reset_session_locked(session & s, const std::string & sid) {
    s.epoch++;
    s.sid              = sid;
    s.topk             = s.topk_next;
    s.t_start          = now_ns();
    s.totals           = {};
    s.n_graphs         = 0;
    s.n_ctx_ids        = 0;
    s.sample_steps     = s.sample_steps_next;
    s.sample_requests  = s.sample_requests_next;
    s.n_requests       = 0;
    s.file_index       = 0;
    s.retry_after      = 0;
    s.n_open_steps     = 0;
    s.n_deferred_steps = 0;
    s.log.max_bytes    = s.max_bytes_next;
    s.log.keep         = s.keep_next;
    g_reopen.store(false, std::memory_order_relaxed);
}

// session_start's fields after its head, up to the model's: what the session is, who wrote it, the
// caller's metadata, its sampling and rotation, the machine
void write_session_fields(json_out &      j,
                          const session & s,
                          int32_t         level,
                          const char *    wall,
                          const char *    metadata_json) {
    j.key("schema_version");
    j.i64(4);
    j.key("wall_time");
    j.str(wall);
    j.key("level");
    j.str(level_name(level));
    j.key("producer");
    j.raw("{\"llama_cpp_commit\":\"" LLAMA_INSTR_LLAMA_COMMIT "\",\"patch_hash\":\"" LLAMA_INSTR_PATCH_HASH
          "\",\"api_version\":");
    j.i64(LLAMA_INSTR_API_VERSION);
    j.ch('}');
    j.key("pid");
#if defined(_WIN32)
    j.i64(0);
#else
    j.i64((int64_t) getpid());
#endif
    j.key("metadata");
    j.raw(metadata_json && *metadata_json ? metadata_json : "{}");
    if (s.sample_steps > 1 || s.sample_requests > 1) {
        j.key("sample");
        j.raw("{\"steps\":");
        j.i64(s.sample_steps);
        j.raw(",\"requests\":");
        j.i64(s.sample_requests);
        j.ch('}');
    }
    if (s.log.max_bytes > 0) {
        j.key("rotate");
        j.raw("{\"max_bytes\":");
        j.i64(s.log.max_bytes);
        j.raw(",\"keep\":");
        j.i64(s.log.keep);
        j.ch('}');
    }
    write_machine_info(j);
}

// What was there before the session, as its first records after session_start: the buffers that
// exist already (the model's weights, the context's caches...), then the RPC commands kept before
// the session (the model's upload); the session's own follow.
void emit_before_session_locked(session & s) {
    std::vector<std::string> memory_lines;
    memory_snapshot_lines(s.sid, memory_lines);
    for (const std::string & l : memory_lines) {
        s.log.emit(l);
    }
    std::vector<std::string> rpc_lines;
    rpc_session_begin(s.sid, rpc_lines);
    for (const std::string & l : rpc_lines) {
        s.log.emit(l);
    }
}

// The session's first records written, its session_start flushed to the file, and its flusher
// started: LLAMA_INSTR_OK, else the error (the log closed again).
int32_t start_session_locked(session &       s,
                             llama_context * ctx,
                             int32_t         level,
                             const char *    wall,
                             const char *    metadata_json) {
    std::string line;
    json_out    j{ line };
    record_head(j, "session_start", s.t_start, s.sid);
    const size_t head = line.size();
    write_session_fields(j, s, level, wall, metadata_json);
    if (ctx) {
        // ctx is ctx 1 in every record: its id is reserved now, and it joins on its own
        // thread when its next step begins (it may be decoding right now)
        ctx_state & st    = state_locked(s, ctx);
        st.reserved_epoch = s.epoch;
        st.reserved_id    = ++s.n_ctx_ids;
        write_model_info(j, ctx);
    }
    j.ch('}');
    // each file of the session begins with these fields again (new_file_locked)
    s.start_body.assign(line, head, line.size() - head - 1);
    s.log.quiet = true;  // a failure here is the caller's error, not a warning
    s.log.emit(line);
    s.log.write_buffered();
    s.log.quiet = false;
    if (s.log.status != LLAMA_INSTR_OK) {
        const std::string why = s.log.failure_message();
        s.log.close();
        return api_error(LLAMA_INSTR_ERR_IO, why);
    }
    if (!start_flusher_locked(s)) {
        s.log.close();
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "cannot start the log's flusher thread");
    }
    emit_before_session_locked(s);
    return LLAMA_INSTR_OK;
}

// What each context's host did after its last step, llama.cpp's counters of each context, and the
// sampler chains still alive: the records a session's end writes before its session_end.
void end_lines_locked(session & s, std::vector<std::string> & host_lines) {
    host_lines.emplace_back();
    for (auto & kv : s.ctxs) {
        if (host_record(*kv.second, s.epoch, host_lines.back())) {
            host_lines.emplace_back();
        }
        if (perf_record(kv.first, *kv.second, s.epoch, false, host_lines.back())) {
            host_lines.emplace_back();
        }
    }
    host_lines.pop_back();
    chains_session_end_locked(s.sid, host_lines);
}

// session_end, at t: its status and the session's totals
void write_session_end(json_out & j, const session & s, const std::string & status, int64_t t) {
    record_head(j, "session_end", t, s.sid);
    j.key("status");
    j.str(status);
    j.key("totals");
    j.raw("{\"steps\":");
    j.i64(s.totals.n_steps);
    j.raw(",\"tokens\":");
    j.i64(s.totals.n_tokens);
    j.raw(",\"prompt_tokens\":");
    j.i64(s.totals.n_prompt_tokens);
    j.raw(",\"gen_tokens\":");
    j.i64(s.totals.n_gen_tokens);
    j.raw(",\"computes\":");
    j.i64(s.totals.n_computes);
    j.raw(",\"dur\":");
    j.i64(t - s.t_start);
    j.raw(",\"records\":");
    j.i64(s.log.n_records + 1);
    j.raw(",\"lost\":");
    j.i64(s.log.n_lost);
    j.raw("}}");
}

// A session's end that failed (out of memory while formatting): recording off, what the log holds
// written, the log closed all the same.
void close_after_failure() noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        llama_instr_level_exchange(LLAMA_INSTR_LEVEL_OFF);
        if (s.log.fp) {
            s.log.write_buffered();
        }
    } catch (...) {
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.log.fp) {
            s.log.close();
        }
    } catch (...) {
    }
}

}  // namespace

//
// the hook that ends a context's state: see llama-instr-session.cpp
//

//
// C API
//

int32_t llama_instr_api_version(void) noexcept {
    return LLAMA_INSTR_API_VERSION;
}

#define LLAMA_INSTR_STR2(x) #x
#define LLAMA_INSTR_STR(x)  LLAMA_INSTR_STR2(x)

const char * llama_instr_build_info(void) noexcept {
    // a literal: nothing to allocate, nothing to throw
    return "{\"api_version\":" LLAMA_INSTR_STR(
        LLAMA_INSTR_API_VERSION) ",\"llama_cpp_commit\":\"" LLAMA_INSTR_LLAMA_COMMIT
                                 "\",\"patch_hash\":\"" LLAMA_INSTR_PATCH_HASH "\"}";
}

int32_t llama_instr_session_begin(llama_context * ctx,
                                  const char *    path,
                                  int32_t         level,
                                  const char *    metadata_json) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_BUSY, "a session is already open (call llama_instr_session_end first)");
        }
        if (level < LLAMA_INSTR_LEVEL_MINIMAL || level > LLAMA_INSTR_LEVEL_VERBOSE) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "level must be 1 (minimal), 2 (detailed) or 3 (verbose)");
        }
        if (metadata_json && *metadata_json && json_object_check(metadata_json, nullptr, 0) != json_check::ok) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "metadata must be a JSON object on one line, in UTF-8");
        }

        std::string sid, default_name;
        char        wall[64];
        new_ids(sid, wall, default_name);
        const std::string p = path && *path ? path : default_name;

        if (!s.log.open(p)) {
            return api_error(LLAMA_INSTR_ERR_IO, "cannot open the log " + p + " for writing: " + strerror(errno));
        }
        // from here on, a failure closes the file again: no session is left half open
        try {
            reset_session_locked(s, sid);
            const int32_t rc = start_session_locked(s, ctx, level, wall, metadata_json);
            if (rc != LLAMA_INSTR_OK) {
                return rc;
            }
        } catch (...) {
            std::vector<std::string> rpc_lines;
            rpc_session_end(s.sid, rpc_lines);
            s.log.close();
            throw;
        }

        // sampling and rotation are the next session's only: a later session_begin without them
        // records every step into one file
        s.sample_steps_next    = 1;
        s.sample_requests_next = 1;
        s.max_bytes_next       = 0;
        s.keep_next            = 0;
        llama_instr_level_exchange(level);
        return LLAMA_INSTR_OK;
    } catch (const std::exception & e) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, std::string("session begin failed: ") + e.what());
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "session begin failed");
    }
}

int32_t llama_instr_session_end(const char * status) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        // under the lock: a set_level can't turn it on again between this and the close
        llama_instr_level_exchange(LLAMA_INSTR_LEVEL_OFF);
        if (g_reopen.load(std::memory_order_relaxed)) {
            new_file_locked(s);  // logrotate moved the file: the session ends in the new one
        }
        std::string st         = status && *status ? status : "ok";
        const bool  bad_status = st != "ok" && st != "error" && st != "interrupted";
        if (bad_status) {
            st = "error";
        }
        std::vector<std::string> rpc_lines;  // the RPC commands not written yet
        rpc_session_end(s.sid, rpc_lines);
        std::vector<std::string> host_lines;
        end_lines_locked(s, host_lines);
        for (const std::string & l : host_lines) {
            s.log.emit(l);
        }
        for (const std::string & l : rpc_lines) {
            s.log.emit(l);
        }
        std::string line;
        json_out    j{ line };
        write_session_end(j, s, st, now_ns());
        s.log.emit(line);
        s.log.write_buffered();
        const char * gone = s.log.gone();
        if (gone) {
            s.log.fail(LLAMA_INSTR_ERR_IO, "the log " + s.log.path + " " + gone + ": its records are lost");
        }
        if (!s.log.close()) {
            s.log.fail(LLAMA_INSTR_ERR_IO, "closing the log " + s.log.path + " failed: " + strerror(errno));
        }
        if (s.log.status != LLAMA_INSTR_OK) {
            return api_error(s.log.status, s.log.failure_message());
        }
        if (bad_status) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG,
                             "status must be \"ok\", \"error\" or \"interrupted\" (\"error\" was written)");
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        close_after_failure();
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "session end failed (out of memory?): the log is incomplete");
    }
}

int32_t llama_instr_record_transfers(int32_t on) noexcept {
    try {
        if (!rpc_record_load(on != 0)) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "this build has no RPC backend");
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "record_transfers failed");
    }
}

int32_t llama_instr_set_level(int32_t level) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (level < LLAMA_INSTR_LEVEL_OFF || level > LLAMA_INSTR_LEVEL_VERBOSE) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "level must be 0..3");
        }
        return llama_instr_level_exchange(level);
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_level failed");
    }
}

int32_t llama_instr_get_level(void) noexcept {
    return g_llama_instr_level.load(std::memory_order_relaxed);
}

int32_t llama_instr_set_topk(int32_t k) noexcept {
    if (k < 1 || k > 1000) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "top-k must be between 1 and 1000");
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        s.topk_next = k;
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_topk failed");
    }
}

int32_t llama_instr_flush(void) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        s.log.write_buffered();
        if (s.log.status == LLAMA_INSTR_ERR_IO) {
            return api_error(s.log.status, s.log.failure_message());
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "flush failed");
    }
}

int32_t llama_instr_session_path(char * buf, size_t buf_size) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.epoch == 0) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "there was no session yet");
        }
        if (buf && buf_size > 0) {
            snprintf(buf, buf_size, "%s", s.log.path.c_str());
        }
        return (int32_t) s.log.path.size();
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "session_path failed");
    }
}

int32_t llama_instr_set_memory_budget(const char * spec) noexcept {
    try {
        std::string why;
        if (!memory_set_budget(spec, why)) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, why);
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_memory_budget failed");
    }
}

int32_t llama_instr_memory_breakdown(llama_context * ctx, char * buf, size_t buf_size) noexcept {
    if (!ctx) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "ctx is NULL");
    }
    try {
        const std::string b = memory_breakdown_json(ctx);
        if (buf && buf_size > 0) {
            snprintf(buf, buf_size, "%s", b.c_str());
        }
        return (int32_t) b.size();
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "memory_breakdown failed");
    }
}

int32_t llama_instr_graph_reserve(llama_context * ctx,
                                  int32_t         n_tokens,
                                  int32_t         n_outputs,
                                  char *          buf,
                                  size_t          buf_size) noexcept {
    if (!ctx || n_tokens < 1 || n_outputs < 1 || n_outputs > n_tokens) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "ctx is NULL, or n_tokens or n_outputs out of range");
    }
    try {
        const std::string g = reserved_graph_json(ctx, n_tokens, n_outputs);
        if (g.empty()) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "llama.cpp could not build the graph");
        }
        if (g.size() > INT32_MAX) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "the graph table is over 2 GiB");
        }
        if (buf && buf_size > 0) {
            snprintf(buf, buf_size, "%s", g.c_str());
        }
        return (int32_t) g.size();
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "graph_reserve failed");
    }
}

int32_t llama_instr_memory_failure(char * buf, size_t buf_size) noexcept {
    try {
        const std::string f = memory_last_failure();
        if (buf && buf_size > 0) {
            snprintf(buf, buf_size, "%s", f.c_str());
        }
        return (int32_t) f.size();
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "memory_failure failed");
    }
}

int32_t llama_instr_session_totals(llama_instr_totals * totals) noexcept {
    if (!totals) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "totals is NULL");
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.epoch == 0) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "there was no session yet");
        }
        *totals = totals_locked(s);
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "session_totals failed");
    }
}

int32_t llama_instr_set_request(llama_context * ctx, const char * request_id) noexcept {
    try {
        if (!ctx) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "ctx is NULL");
        }
        const std::string id = request_id ? request_id : "";
        if (id.size() > 128) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "a request id is at most 128 bytes");
        }
        ctx_state *                 st = ctx_get(ctx);
        auto &                      s  = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (!st) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "out of memory");
        }
        st->request_next = id;
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_request failed (out of memory?)");
    }
}

int32_t llama_instr_set_sampling(int32_t every_steps, int32_t every_requests) noexcept {
    if (every_steps < 1 || every_steps > 1000000 || every_requests < 1 || every_requests > 1000000) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "sampling takes one in N with N from 1 to 1000000");
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        s.sample_steps_next    = every_steps;
        s.sample_requests_next = every_requests;
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_sampling failed");
    }
}

int32_t llama_instr_set_rotation(int64_t max_bytes, int32_t keep) noexcept {
    if (max_bytes == 0 ? keep != 0 : (max_bytes < k_min_rotate_bytes || keep < 1 || keep > 1000)) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG,
                         "rotation takes max_bytes 0 (never) with keep 0, or max_bytes >= 65536 with keep 1..1000");
    }
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        s.max_bytes_next = max_bytes;
        s.keep_next      = keep;
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "set_rotation failed");
    }
}

void llama_instr_reopen(void) noexcept {
    g_reopen.store(true, std::memory_order_relaxed);  // a lock-free store: safe in a signal handler
}

int32_t llama_instr_request_begin(llama_context * ctx, int32_t seq_id) noexcept {
    try {
        if (!ctx || seq_id < -1 || seq_id >= k_max_seq) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "request_begin needs a context and a sequence id -1..65535");
        }
        ctx_state *                 st = ctx_get(ctx);
        auto &                      s  = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (!st) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "out of memory");
        }
        if (st->sample_epoch != s.epoch) {
            st->sample_epoch = s.epoch;
            st->request_full = -1;
            st->seq_full.clear();
        }
        const bool full = s.n_requests++ % s.sample_requests == 0;
        if (seq_id < 0) {
            st->request_full = full ? 1 : 0;
        } else {
            if (st->seq_full.size() <= (size_t) seq_id) {
                st->seq_full.resize((size_t) seq_id + 1, -1);
            }
            st->seq_full[seq_id] = full ? 1 : 0;
        }
        // the level in force now (llama_instr_set_level may have changed the session's), as its steps take it
        const int32_t now = g_llama_instr_level.load(std::memory_order_relaxed);
        return full ? std::max<int32_t>(now, LLAMA_INSTR_LEVEL_MINIMAL) : LLAMA_INSTR_LEVEL_MINIMAL;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "request_begin failed (out of memory?)");
    }
}

int32_t llama_instr_request_end(llama_context * ctx, int32_t seq_id) noexcept {
    try {
        if (!ctx || seq_id < -1 || seq_id >= k_max_seq) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "request_end needs a context and a sequence id -1..65535");
        }
        // found, never made: a context without a state began no request, and one the program
        // has freed since (a server ending a request at its shutdown) must not get one
        ctx_state *                 st = ctx_find(ctx);
        auto &                      s  = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (!st || st->sample_epoch != s.epoch) {
            return LLAMA_INSTR_OK;  // no request of this session began on it
        }
        if (seq_id < 0) {
            st->request_full = -1;
        } else if ((size_t) seq_id < st->seq_full.size()) {
            st->seq_full[seq_id] = -1;
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "request_end failed");
    }
}

int32_t llama_instr_context_id(llama_context * ctx, int64_t * last_step) noexcept {
    if (last_step) {
        *last_step = -1;
    }
    try {
        if (!ctx) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "ctx is NULL");
        }
        ctx_state *                 st = ctx_get(ctx);
        auto &                      s  = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (!st) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "out of memory");
        }
        if (st->epoch == s.epoch) {
            // joined this session (at a step's start): its id, and the number its last step took
            if (last_step) {
                *last_step = st->step;
            }
            return st->id;
        }
        if (st->reserved_epoch != s.epoch) {
            // the id its first step will join with (as session_begin reserves one for its ctx)
            st->reserved_epoch = s.epoch;
            st->reserved_id    = ++s.n_ctx_ids;
        }
        return st->reserved_id;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "context_id failed (out of memory?)");
    }
}

// A record refused by llama_instr_write_record while a session is open is counted in its lost
// records: whoever wrote it meant it for the log, and would otherwise lose it without a trace.
static int32_t record_refused(int32_t code, const char * why) noexcept {
    try {
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (s.log.fp) {
            s.log.n_lost++;
        }
    } catch (...) {
        // the lock failed (std::system_error): the code still says it was refused
    }
    return api_error(code, why);
}

int32_t llama_instr_write_record(const char * type, const char * fields_json) noexcept {
    try {
        const size_t n  = type ? strlen(type) : 0;
        bool         ok = n >= 1 && n <= 32;
        for (size_t i = 0; ok && i < n; i++) {
            ok = (type[i] >= 'a' && type[i] <= 'z') || type[i] == '_';
        }
        if (!ok) {
            return record_refused(LLAMA_INSTR_ERR_INVALID_ARG, "a record type is 1..32 characters of [a-z_]");
        }
        const json_check check = fields_json ? json_object_check(fields_json, RESERVED_KEYS, 3) : json_check::invalid;
        if (check == json_check::invalid) {
            return record_refused(LLAMA_INSTR_ERR_INVALID_ARG, "fields must be a JSON object on one line, in UTF-8");
        }
        if (check == json_check::reserved) {
            return record_refused(LLAMA_INSTR_ERR_INVALID_ARG, "fields must not hold type, ts or sid");
        }
        // the object's members, without its braces (a valid object: its first and last
        // non-blank characters are they)
        std::string inner             = fields_json;
        inner                         = inner.substr(inner.find('{') + 1);
        inner                         = inner.substr(0, inner.rfind('}'));
        auto &                      s = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (s.n_open_steps == 0 && file_due_locked(s)) {
            new_file_locked(s);
        }
        std::string line;
        json_out    j{ line };
        record_head(j, type, now_ns(), s.sid);
        if (inner.find_first_not_of(" \t") != std::string::npos) {
            j.ch(',');
            j.raw(inner);
        }
        j.ch('}');
        s.log.emit(line);
        return LLAMA_INSTR_OK;
    } catch (...) {
        return record_refused(LLAMA_INSTR_ERR_INTERNAL, "write_record failed (out of memory?)");
    }
}

int32_t llama_instr_capture(llama_context * ctx, const char * const * patterns, int32_t n_patterns) noexcept {
    try {
        if (!ctx || n_patterns < 0 || (n_patterns > 0 && !patterns)) {
            return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "capture needs a context and n_patterns >= 0");
        }
        std::vector<std::string> pats;
        for (int32_t i = 0; i < n_patterns; i++) {
            if (!patterns[i] || !*patterns[i]) {
                return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "an empty capture pattern");
            }
            pats.emplace_back(patterns[i]);
        }
        ctx_state *                 st = ctx_get(ctx);
        auto &                      s  = S();
        std::lock_guard<std::mutex> lock(s.mtx);
        if (!s.log.fp) {
            return api_error(LLAMA_INSTR_ERR_NO_SESSION, "no session is open");
        }
        if (!st) {
            return api_error(LLAMA_INSTR_ERR_INTERNAL, "out of memory");
        }
        st->capture_next = std::move(pats);
        return LLAMA_INSTR_OK;
    } catch (...) {
        return api_error(LLAMA_INSTR_ERR_INTERNAL, "capture failed (out of memory?)");
    }
}

// read by the thread that decodes ctx, between its decodes; a context without a state captured
// nothing (found, never made: ctx_find never throws, the rest only reads)
int32_t llama_instr_captured_count(llama_context * ctx) noexcept {
    ctx_state * st = ctx ? ctx_find(ctx) : nullptr;
    return st ? (int32_t) st->capture.n_filled : 0;
}

int64_t llama_instr_captured_get(llama_context * ctx,
                                 int32_t         i,
                                 char *          name,
                                 size_t          name_size,
                                 int64_t *       ne,
                                 float *         dst,
                                 int64_t         dst_n) noexcept {
    ctx_state * st = ctx ? ctx_find(ctx) : nullptr;
    if (!st || i < 0 || i >= (int32_t) st->capture.n_filled) {
        return api_error(LLAMA_INSTR_ERR_INVALID_ARG, "no captured output with that index");
    }
    const auto & slot = st->capture.slots[i];
    if (name && name_size > 0) {
        snprintf(name, name_size, "%s", slot.name.c_str());
    }
    if (ne) {
        for (int d = 0; d < GGML_MAX_DIMS; d++) {
            ne[d] = slot.ne[d];
        }
    }
    const int64_t n = (int64_t) slot.data.size();
    if (dst && dst_n >= n) {
        std::copy(slot.data.begin(), slot.data.end(), dst);
    }
    return n;
}

const char * llama_instr_last_error(void) noexcept {
    return t_last_error;
}
