#pragma once

// llamacpp-instr: a step's life, whatever it computes (a decode's ubatches, an encoder's encode).
// It joins the session; its step_begin and its step_end hold a step's own fields, then its kind's;
// its computes are timed and written by llama-instr-timing.h; a step that cannot go on is
// abandoned. A kind of compute adds its hooks, which call these, and its fields: a decode's are
// in llama-instr-step.cpp, an encode's in llama-instr-media.cpp.

#include "llama-instr-session.h"

#include <cstdint>

namespace llama_instr {

// what every step's step_begin says of it, before its kind's fields
struct step_begin_fields {
    const char * kind;      // what it computes: "prompt", "gen", "encode"
    int64_t      n_tokens;  // its input's tokens (an encode's: the embeddings it makes)
    int64_t      pos0, pos1;
};

// what every step's step_end says of it, before its kind's fields
struct step_end_fields {
    int64_t t_start, t_end;
    int64_t status;
    int64_t n_tokens, n_outputs;
    int64_t kv_used;  // the cells of its context's cache in use, or -1: no cache
};

// The step begins in the session (its n_tokens counted as prompt or generated tokens): false if
// no session is open. In its compute from here on, with no compute, table or capture of its own
// yet; its kind sets what else it starts with.
bool step_join(ctx_state & st, int32_t n_tokens, bool prompt);

// a step_begin's and a step_end's head and a step's own fields, which its kind's follow
void write_step_begin_head(json_out & j, const ctx_state & st, const step_begin_fields & f);
void write_step_end_head(json_out & j, const ctx_state & st, const step_end_fields & f);

// The step's step_begin, emitted: a step's fields, then its kind's (`kind_fields(j)`).
template <typename F> void write_step_begin(ctx_state & st, const step_begin_fields & f, F && kind_fields) {
    json_out j{ st.line };
    write_step_begin_head(j, st, f);
    kind_fields(j);
    j.ch('}');
    emit(st.epoch, st.line);
}

// The step's step_end, in st.line for its kind to emit (a decode's may wait for its context's
// synchronization): a step's fields, then its kind's (`kind_fields(j)`).
template <typename F> void format_step_end(ctx_state & st, const step_end_fields & f, F && kind_fields) {
    json_out j{ st.line };
    write_step_end_head(j, st, f);
    kind_fields(j);
    j.ch('}');
}

// step_end's "logits": what the step put out, n_outputs rows of `width` f32 values (a decode's
// vocabulary, an encode's embedding)
void write_step_output(json_out & j, int64_t width, int64_t n_outputs);

// A step that cannot go on, after a failure in `hook`: what it holds to write is dropped, it is
// out of its compute and ended in the session (so that the log can rotate and its context's next
// step is recorded), and the failure is counted. A step abandoned before its step_begin was
// written leaves no record; its kind's hook then records nothing more of it.
void step_abandon(ctx_state & st, const char * hook) noexcept;

}  // namespace llama_instr
