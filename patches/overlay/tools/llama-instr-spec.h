#pragma once

// llamacpp-instr: llama-server's speculative decoding in the session (docs/schema.md): each
// context's model and role (`context` records: the target, its draft), one `spec` record per
// verify step of a slot (tokens drafted and accepted, the draft steps that made them, the target's
// step that verified them, and the time each took), and per request the totals in its record's
// `spec` object. Included by llama-instr-tools.h; the server runs these hooks on its one thread
// (update_slots), and with no session open each is one call to llama_instr_get_level().

#include "llama-instr-tools.h"
#include "llama.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace llama_instr_tools {

// A request's speculative decoding, summed over its verify steps (the server's own counts: the
// drafted and accepted tokens it reports in the response's timings)
struct spec_totals {
    std::string             type;              // the speculation the server ran ("draft-simple", ...)
    int64_t                 drafted      = 0;  // tokens drafted (timings.draft_n)
    int64_t                 accepted     = 0;  // of them, accepted (timings.draft_n_accepted)
    int64_t                 verify_steps = 0;  // target steps that verified a draft
    int64_t                 draft_ns     = 0;  // drafting (its share of each round and of the draft's catch-up)
    int64_t                 verify_ns    = 0;  // verifying (its share of each verify step)
    int64_t                 rejected_ns  = 0;  // of both, the share of the tokens rejected
    std::vector<uint64_t>   drafted_by_pos;    // verify steps with a token at draft position i
    std::vector<uint64_t>   accepted_by_pos;   // ... where it was accepted
    static constexpr size_t MAX_POS = 256;     // positions kept (--spec-draft-n-max is far below)
};

// What the server's thread measured since the last verify of each slot, and of the last target
// decode. Bounded: one entry per slot.
struct spec_state {
    std::mutex  mtx;
    std::string type;               // the speculation configured (context_roles)
    int32_t     ctx_tgt       = 0;  // the contexts' ids in the session
    int32_t     ctx_dft       = 0;
    // the drafting round in progress (draft_round_begin .. draft_round_end)
    int64_t     round_t0      = 0;
    int64_t     round_step0   = -1;  // the draft context's last step before it
    // the last drafting round
    int64_t     round_start   = 0;
    int64_t     round_dur     = 0;
    int64_t     round_first   = -1;  // its draft steps, first and last (-1: none)
    int64_t     round_last    = -1;
    int64_t     round_drafted = 0;   // tokens drafted in it, all slots
    // the last target decode, and the draft's catch-up on its batch
    int64_t     verify_start  = 0;
    int64_t     verify_dur    = 0;
    int64_t     verify_tokens = 0;
    int64_t     verify_step   = -1;
    int64_t     catchup_dur   = 0;
    int64_t     catchup_step  = -1;

    struct slot_round {
        int64_t drafted   = 0;
        int64_t t_draft   = 0;
        int64_t draft_dur = 0;  // the round's wall time (all its slots)
        int64_t draft_ns  = 0;
        int64_t first = -1, last = -1;
    };

    std::vector<slot_round> slots;  // by slot id
};

inline spec_state & spec() {
    static spec_state s;
    return s;
}

// the model's description for a context record: name, architecture, layers, parameters, bytes
inline std::string model_fields(const llama_model * m, const std::string & path) {
    char        buf[256];
    std::string f = "{";
    if (llama_model_meta_val_str(m, "general.name", buf, sizeof(buf)) >= 0) {
        f += "\"name\":" + json_str(error_text(buf)) + ",";
    }
    if (llama_model_meta_val_str(m, "general.architecture", buf, sizeof(buf)) >= 0) {
        f += "\"architecture\":" + json_str(error_text(buf)) + ",";
    }
    if (llama_model_desc(m, buf, sizeof(buf)) >= 0) {
        f += "\"desc\":" + json_str(error_text(buf)) + ",";
    }
    if (!path.empty()) {
        f += "\"path\":" + json_str(error_text(path)) + ",";
    }
    f += "\"n_layer\":" + std::to_string(llama_model_n_layer(m));
    f += ",\"n_params\":" + std::to_string(llama_model_n_params(m));
    f += ",\"size_bytes\":" + std::to_string(llama_model_size(m)) + "}";
    return f;
}

// the configured speculation types' names (but "none"), joined with ','
template <class Types, class Name> inline std::string spec_type_names(const Types & types, Name name) {
    std::string out;
    for (const auto & t : types) {
        const std::string n = name(t);
        if (n != "none") {
            out += (out.empty() ? "" : ",") + n;
        }
    }
    return out;
}

// One `context` record: `ctx`'s id in the session, its role ("target" or "draft"), its model; the
// target's says how it speculates (`types` empty: it does not).
inline void context_role(llama_context *     ctx,
                         const char *        role,
                         const std::string & path,
                         const std::string & types = "",
                         int32_t             n_max = 0,
                         int32_t             n_min = 0,
                         float               p_min = 0.0f) {
    if (!active() || !ctx) {
        return;
    }
    int64_t       last = -1;
    const int32_t id   = llama_instr_context_id(ctx, &last);
    if (id <= 0) {
        return;
    }
    std::string f = "{\"ctx\":" + std::to_string(id) + ",\"role\":" + json_str(role);
    f += ",\"model\":" + model_fields(llama_get_model(ctx), path);
    f += ",\"n_ctx\":" + std::to_string(llama_n_ctx(ctx)) + ",\"n_seq_max\":" + std::to_string(llama_n_seq_max(ctx));
    if (!types.empty()) {
        char pm[32];
        snprintf(pm, sizeof(pm), "%.4g", (double) p_min);
        f += ",\"spec\":{\"type\":" + json_str(error_text(types)) + ",\"n_max\":" + std::to_string(n_max);
        f += ",\"n_min\":" + std::to_string(n_min) + ",\"p_min\":" + pm + "}";
    }
    llama_instr_write_record("context", (f + "}").c_str());
    auto &                      s = spec();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (std::string(role) == "draft") {
        s.ctx_dft = id;
    } else {
        s.ctx_tgt = id;
        s.type    = error_text(types);
    }
}

// the last step `ctx` began in the session (-1: none, or no context)
inline int64_t last_step(llama_context * ctx) {
    int64_t last = -1;
    if (ctx) {
        llama_instr_context_id(ctx, &last);
    }
    return last;
}

// The server drafts for its slots (common_speculative_draft): before and after.
inline void draft_round_begin(llama_context * ctx_dft) {
    if (!active()) {
        return;
    }
    auto &                      s = spec();
    std::lock_guard<std::mutex> lock(s.mtx);
    s.round_t0      = now_ns();
    s.round_step0   = last_step(ctx_dft);
    s.round_drafted = 0;
}

inline void draft_round_end(llama_context * ctx_dft) {
    if (!active()) {
        return;
    }
    auto &                      s = spec();
    std::lock_guard<std::mutex> lock(s.mtx);
    const int64_t               t1   = now_ns();
    const int64_t               last = last_step(ctx_dft);
    s.round_start                    = s.round_t0;
    s.round_dur                      = s.round_t0 > 0 && t1 > s.round_t0 ? t1 - s.round_t0 : 0;
    s.round_first                    = last > s.round_step0 ? s.round_step0 + 1 : -1;
    s.round_last                     = last > s.round_step0 ? last : -1;
}

// The slot `slot` drafted `n` tokens in the round that just ended.
inline void slot_drafted(int slot, size_t n) {
    if (!active() || slot < 0 || slot >= 65536) {
        return;
    }
    auto &                      s = spec();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (s.slots.size() <= (size_t) slot) {
        s.slots.resize((size_t) slot + 1);
    }
    s.slots[slot] = { (int64_t) n, s.round_start, s.round_dur, 0, s.round_first, s.round_last };
    s.round_drafted += (int64_t) n;
}

// when a hook measures a span: now, with a session open (else 0, and nothing is measured)
inline int64_t clock_if_active() {
    return active() ? now_ns() : 0;
}

// The target decoded a batch of `n_tokens` (from t0), and the draft then took it in (from t1,
// common_speculative_process; t1 0: no draft context). The drafts of the round are shared out
// now: each slot by its tokens drafted.
inline void target_decoded(llama_context * ctx_tgt, llama_context * ctx_dft, int64_t t0, int64_t t1, int64_t n_tokens) {
    if (t0 <= 0 || !active()) {
        return;
    }
    const int64_t               t2 = now_ns();
    auto &                      s  = spec();
    std::lock_guard<std::mutex> lock(s.mtx);
    s.verify_start  = t0;
    s.verify_dur    = (t1 > t0 ? t1 : t2) - t0;
    s.verify_tokens = n_tokens;
    s.verify_step   = last_step(ctx_tgt);
    s.catchup_dur   = t1 > 0 && t2 > t1 ? t2 - t1 : 0;
    s.catchup_step  = t1 > 0 ? last_step(ctx_dft) : -1;
    if (s.round_drafted > 0) {
        for (auto & r : s.slots) {
            if (r.drafted > 0 && r.t_draft == s.round_start && r.draft_ns == 0) {
                r.draft_ns = s.round_dur * r.drafted / s.round_drafted;
            }
        }
        s.round_drafted = 0;
    }
}

// The slot `slot` (serving the task `task_id`) verified its draft of `n_draft` tokens in the last
// target decode and accepted `n_accepted` of them: its `spec` record, and its request's totals
// (of its first task, as the record's other figures; drafted and accepted as the slot counts them
// for the response's timings: `task_drafted`, `task_accepted`).
inline void spec_verified(int      task_id,
                          int      slot,
                          size_t   n_draft,
                          size_t   n_accepted,
                          uint64_t task_drafted,
                          uint64_t task_accepted) {
    if (!active() || slot < 0 || n_draft == 0) {
        return;
    }
    std::string f;
    {
        auto &                      s = spec();
        std::lock_guard<std::mutex> lock(s.mtx);
        spec_state::slot_round      r;
        if ((size_t) slot < s.slots.size()) {
            r             = s.slots[slot];
            s.slots[slot] = {};
        }
        const int64_t d           = (int64_t) n_draft;
        const int64_t a           = (int64_t) std::min(n_accepted, n_draft);
        const int64_t n_all       = s.verify_tokens > 0 ? s.verify_tokens : d + 1;
        // this slot's share of the verify step, and of the draft's catch-up, by tokens
        const int64_t verify_ns   = s.verify_dur * std::min(d + 1, n_all) / n_all;
        const int64_t draft_ns    = r.draft_ns + s.catchup_dur * std::min(d + 1, n_all) / n_all;
        const int64_t rejected_ns = verify_ns * (d - a) / (d + 1) + draft_ns * (d - a) / d;

        std::lock_guard<std::mutex> rlock(requests_mutex());
        request_state *             rq = request_of_task_locked(task_id);
        std::string                 id = rq ? rq->id : std::string();
        if (rq && rq->task == task_id) {
            request_state & q = *rq;
            if (!q.spec) {
                q.spec       = std::make_shared<spec_totals>();
                q.spec->type = s.type;
            }
            spec_totals & t = *q.spec;
            t.drafted       = (int64_t) task_drafted;
            t.accepted      = (int64_t) task_accepted;
            t.verify_steps++;
            t.draft_ns += draft_ns;
            t.verify_ns += verify_ns;
            t.rejected_ns += rejected_ns;
            const size_t n_pos = std::min((size_t) d, spec_totals::MAX_POS);
            if (t.drafted_by_pos.size() < n_pos) {
                t.drafted_by_pos.resize(n_pos, 0);
                t.accepted_by_pos.resize(n_pos, 0);
            }
            for (size_t i = 0; i < n_pos; i++) {
                t.drafted_by_pos[i]++;
                t.accepted_by_pos[i] += (int64_t) i < a ? 1 : 0;
            }
        }
        f = "{\"request\":" + json_str(id) + ",\"slot\":" + std::to_string(slot);
        f += ",\"spec_type\":" + json_str(s.type);
        f += ",\"ctx\":" + std::to_string(s.ctx_tgt) + ",\"step\":" + std::to_string(s.verify_step);
        if (s.ctx_dft > 0) {
            f += ",\"draft_ctx\":" + std::to_string(s.ctx_dft);
        }
        if (r.first >= 0) {
            f += ",\"draft_steps\":[" + std::to_string(r.first) + "," + std::to_string(r.last) + "]";
        }
        if (s.catchup_step >= 0) {
            f += ",\"catchup_step\":" + std::to_string(s.catchup_step);
        }
        f += ",\"drafted\":" + std::to_string(d) + ",\"accepted\":" + std::to_string(a);
        f += ",\"rejected_at\":" + json_int_or_null(a < d, a);
        f += ",\"t_draft\":" + std::to_string(r.t_draft) + ",\"draft_dur\":" + std::to_string(r.draft_dur);
        f += ",\"draft_ns\":" + std::to_string(draft_ns);
        f += ",\"t_verify\":" + std::to_string(s.verify_start) + ",\"verify_dur\":" + std::to_string(s.verify_dur);
        f += ",\"verify_ns\":" + std::to_string(verify_ns);
        f += ",\"rejected_ns\":" + std::to_string(rejected_ns) + "}";
    }
    llama_instr_write_record("spec", f.c_str());
}

// the request record's `spec` object ("" when it verified no draft)
inline std::string spec_fields(const request_state & r) {
    if (!r.spec) {
        return "";
    }
    const spec_totals & t = *r.spec;
    std::string         f = ",\"spec\":{\"type\":" + json_str(t.type);
    f += ",\"drafted\":" + std::to_string(t.drafted) + ",\"accepted\":" + std::to_string(t.accepted);
    f += ",\"verify_steps\":" + std::to_string(t.verify_steps);
    f += ",\"draft_ns\":" + std::to_string(t.draft_ns) + ",\"verify_ns\":" + std::to_string(t.verify_ns);
    f += ",\"rejected_ns\":" + std::to_string(t.rejected_ns);
    auto list = [](const std::vector<uint64_t> & v) {
        std::string out = "[";
        for (size_t i = 0; i < v.size(); i++) {
            out += (i ? "," : "") + std::to_string(v[i]);
        }
        return out + "]";
    };
    f += ",\"drafted_by_pos\":" + list(t.drafted_by_pos) + ",\"accepted_by_pos\":" + list(t.accepted_by_pos);
    return f + "}";
}

}  // namespace llama_instr_tools
