#pragma once

// llamacpp-instr: what llama.cpp's own programs add to a session that LLAMA_INSTR_LOG opened
// (src/llama-instr-env.cpp): llama-server's requests as `request` records, llama-bench's tests as
// `part` records (docs/schema.md). Header-only, on the public API of llama-instr.h; with no
// session open each call is one call to llama_instr_get_level().

#include "llama-instr.h"

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <unordered_map>

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

struct arrival {
    int64_t     t_ns;
    std::string endpoint;
};

inline std::mutex & arrivals_mutex() {
    static std::mutex m;
    return m;
}

inline std::unordered_map<int, arrival> & arrivals() {
    static std::unordered_map<int, arrival> a;
    return a;
}

// An HTTP request arrived at `t_arrive_ns` and became the server task `task_id`.
inline void request_arrived(int task_id, int64_t t_arrive_ns, const std::string & endpoint) {
    if (!active()) {
        return;
    }
    std::lock_guard<std::mutex> lock(arrivals_mutex());
    if (arrivals().size() >= 4096) {
        arrivals().clear();  // tasks cancelled before a slot finished them: never looked up
    }
    arrivals()[task_id] = { t_arrive_ns, endpoint };
}

// The slot `slot` (its sequence id in the steps' `seqs`) sent the final response of `task_id`:
// write its `request` record. Times come from the slot's own statistics (ggml_time_us, the same
// monotonic clock in µs): t_start_us when the slot began the prompt, t_first_us when it sampled
// the first token. n_gen counts sampled tokens; the last one is never decoded (the slot stops on
// it), so the generated tokens decoded are one fewer.
inline void request_done(int      task_id,
                         int      slot,
                         bool     stream,
                         int64_t  t_start_us,
                         int64_t  t_first_us,
                         uint64_t n_prompt_processed,
                         uint64_t n_gen) {
    if (!active()) {
        return;
    }
    const int64_t t_end   = now_ns();
    const int64_t t_model = t_start_us > 0 ? t_start_us * 1000 : t_end;
    arrival       a{ t_model, "/completion" };
    {
        std::lock_guard<std::mutex> lock(arrivals_mutex());
        auto                        it = arrivals().find(task_id);
        if (it != arrivals().end()) {
            a = it->second;
            arrivals().erase(it);
        }
    }
    const int64_t t_arrive = a.t_ns < t_model ? a.t_ns : t_model;
    const int64_t t_first  = t_first_us * 1000;
    std::string   f        = "{\"id\":" + json_str("task-" + std::to_string(task_id));
    f += ",\"endpoint\":" + json_str(a.endpoint);
    f += ",\"method\":\"POST\",\"status\":200,\"stream\":";
    f += stream ? "true" : "false";
    f += ",\"t_arrive\":" + std::to_string(t_arrive);
    f += ",\"wait\":" + std::to_string(t_model - t_arrive);
    f += ",\"ttft\":" + json_int_or_null(t_first_us > 0 && t_first >= t_arrive, t_first - t_arrive);
    f += ",\"model\":" + std::to_string(t_end - t_model);
    f += ",\"dur\":" + std::to_string(t_end - t_arrive);
    f += ",\"prompt_tokens\":" + std::to_string(n_prompt_processed);
    f += ",\"gen_tokens\":" + std::to_string(n_gen > 0 ? n_gen - 1 : 0);
    f += ",\"slot\":" + std::to_string(slot) + "}";
    llama_instr_write_record("request", f.c_str());
    llama_instr_flush();  // the server may now idle: a follower sees the request at once
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
