// llamacpp-instr: a step's life, whatever it computes (llama-instr-step.h), and the kind of step
// a llama_decode call is: step_begin, then (after its end time is taken) the graph tables, compute
// records, RPC commands, top-k logits and step_end; written at llama_decode's return, or at the
// host's next synchronization when a device's times are read then.

#include "llama-instr-step.h"

#include "llama-context.h"
#include "llama-instr-env.h"
#include "llama-instr-hooks.h"
#include "llama-instr-memory.h"
#include "llama-instr-rpc.h"
#include "llama-instr-timing.h"
#include "llama-model.h"

#include <algorithm>
#include <chrono>
#include <thread>

using namespace llama_instr;

std::atomic<int64_t> llama_instr::g_llama_instr_write_delay_us{ 0 };

//
// a step, whatever it computes
//

bool llama_instr::step_join(ctx_state & st, int32_t n_tokens, bool prompt) {
    if (!ctx_join(st, n_tokens, prompt)) {
        return false;
    }
    st.in_decode        = true;
    st.ubatch           = 0;
    st.ubatch_tokens    = 0;
    st.capture.n_filled = 0;
    st.n_tables         = 0;
    return true;
}

void llama_instr::write_step_begin_head(json_out & j, const ctx_state & st, const step_begin_fields & f) {
    record_head(j, "step_begin", now_ns(), st.sid);
    j.key("step");
    j.i64(st.step);
    j.key("ctx");
    j.i64(st.id);
    j.key("n_tokens");
    j.i64(f.n_tokens);
    j.key("pos");
    j.ch('[');
    j.i64(f.pos0);
    j.ch(',');
    j.i64(f.pos1);
    j.ch(']');
    j.key("kind");
    j.str(f.kind);
    j.key("level");
    j.str(level_name(st.level));
    if (!st.request.empty()) {
        j.key("request");
        j.str(st.request);
    }
}

void llama_instr::write_step_end_head(json_out & j, const ctx_state & st, const step_end_fields & f) {
    record_head(j, "step_end", f.t_end, st.sid);
    j.key("step");
    j.i64(st.step);
    j.key("ctx");
    j.i64(st.id);
    j.key("t_start");
    j.i64(f.t_start);
    j.key("dur");
    j.i64(f.t_end - f.t_start);
    j.key("status");
    j.i64(f.status);
    j.key("n_tokens");
    j.i64(f.n_tokens);
    j.key("n_outputs");
    j.i64(f.n_outputs);
    j.key("n_computes");
    j.i64(st.ubatch);
    j.key("kv_used");
    j.i64(f.kv_used);
}

void llama_instr::write_step_output(json_out & j, int64_t width, int64_t n_outputs) {
    j.key("logits");
    j.raw("{\"shape\":[");
    j.i64(width);
    j.ch(',');
    j.i64(n_outputs);
    j.raw("],\"type\":\"f32\",\"bytes\":");
    j.i64(width * n_outputs * 4);
    j.ch('}');
}

void llama_instr::step_abandon(ctx_state & st, const char * hook) noexcept {
    clear_step_rows(st);
    st.in_decode = false;
    hook_failed(st.epoch, hook);
    step_done(st);
}

//
// a decode's step
//

namespace {

// several sequences, or one other than 0: tokens and positions per sequence
void write_decode_seqs(json_out & j, const ctx_state & st) {
    if (st.seqs.size() > 1 || (st.seqs.size() == 1 && st.seqs[0].seq != 0)) {
        j.key("seqs");
        j.ch('[');
        for (const auto & q : st.seqs) {
            j.sep();
            j.ch('[');
            j.i64(q.seq);
            j.ch(',');
            j.i64(q.n_tokens);
            j.ch(',');
            j.i64(q.pos0);
            j.ch(',');
            j.i64(q.pos1);
            j.ch(']');
        }
        j.ch(']');
    }
}

// DETAILED: the batch's tokens, and each one's text
void write_decode_tokens(json_out & j, llama_context * ctx, const llama_batch & batch) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    j.key("tokens");
    j.ch('[');
    for (int i = 0; i < batch.n_tokens; i++) {
        if (i) {
            j.ch(',');
        }
        j.i64(batch.token[i]);
    }
    j.ch(']');
    j.key("pieces");
    j.ch('[');
    char piece[256];
    for (int i = 0; i < batch.n_tokens; i++) {
        if (i) {
            j.ch(',');
        }
        const int n = llama_token_to_piece(vocab, batch.token[i], piece, sizeof(piece), 0, true);
        j.str(piece, n > 0 ? (size_t) n : 0);
    }
    j.ch(']');
}

// a decode's step_begin: a step's fields, then the medium whose embeddings it decodes, its
// sequences and its tokens
void write_decode_begin(ctx_state &         st,
                        llama_context *     ctx,
                        const llama_batch & batch,
                        int64_t             p0,
                        int64_t             p1,
                        bool                prompt) {
    write_step_begin(st, { prompt ? "prompt" : "gen", batch.n_tokens, p0, p1 }, [&](json_out & j) {
        if (st.media > 0) {
            // the embeddings of a medium's slice (llama_instr_set_media)
            j.key("media");
            j.ch('[');
            j.i64(st.media);
            j.ch(',');
            j.i64(st.media_slice);
            j.ch(']');
        }
        write_decode_seqs(j, st);
        if (st.level >= LLAMA_INSTR_LEVEL_DETAILED && batch.token) {
            write_decode_tokens(j, ctx, batch);
        }
    });
}

void write_topk(ctx_state & st, llama_context * ctx, int64_t n_outputs, int64_t n_vocab) {
    const float * logits = llama_get_logits(ctx);
    const int32_t k      = (int32_t) std::min<int64_t>(st.topk, n_vocab);
    if (!logits || k <= 0) {
        return;
    }
    json_out j{ st.line };
    record_head(j, "topk", now_ns(), st.sid);
    j.key("ctx");
    j.i64(st.id);
    j.key("step");
    j.i64(st.step);
    j.key("k");
    j.i64(k);
    j.key("rows");
    j.ch('[');
    st.scratch_ids.resize(k);
    for (int64_t r = 0; r < n_outputs; r++) {
        const float * row   = logits + r * n_vocab;
        // one pass keeping the k best so far, sorted (by logit, then lower id): once k are kept,
        // a block of logits none of which beats the k-th best is passed over whole (one vector
        // comparison in place of sixteen)
        int32_t *     best  = st.scratch_ids.data();
        int32_t       n     = 0;
        float         worst = 0.0f;  // row[best[k - 1]] once n == k
        constexpr int BLOCK = 16;
        for (int32_t i = 0; i < (int32_t) n_vocab; i++) {
            if (n == k && i % BLOCK == 0 && i + BLOCK <= n_vocab) {
                bool any = false;
                for (int b = 0; b < BLOCK; b++) {
                    any |= row[i + b] > worst;
                }
                if (!any) {
                    i += BLOCK - 1;
                    continue;
                }
            }
            if (n == k && !(row[i] > worst)) {
                continue;
            }
            int32_t pos = n < k ? n++ : k - 1;
            while (pos > 0 && row[i] > row[best[pos - 1]]) {
                best[pos] = best[pos - 1];
                pos--;
            }
            best[pos] = i;
            if (n == k) {
                worst = row[best[k - 1]];
            }
        }
        j.sep();
        j.raw("{\"row\":");
        j.i64(r);
        j.raw(",\"ids\":[");
        for (int32_t i = 0; i < k; i++) {
            if (i) {
                j.ch(',');
            }
            j.i64(st.scratch_ids[i]);
        }
        j.raw("],\"logits\":[");
        for (int32_t i = 0; i < k; i++) {
            if (i) {
                j.ch(',');
            }
            j.f64(row[st.scratch_ids[i]]);
        }
        j.raw("]}");
    }
    j.ch(']');
    j.ch('}');
    emit(st.epoch, st.line);
}

// the step whose records waited for a synchronization (ctx_state::step_pending), written now
// that the backends were synchronized (at t_synced): its computes (their devices' times read
// now), then its step_end as formatted at llama_decode's return. The writing is the logger's work
// in the step's host window ("log"), as it is for a step written at llama_decode's return.
void write_pending_step(ctx_state & st, int64_t t_synced) noexcept {
    if (!st.step_pending) {
        return;
    }
    st.step_pending = false;
    try {
        for (compute_rec & c : st.p_computes) {
            c.t_synced = t_synced;  // the synchronization after it
        }
        write_step_computes(st);
        for (const std::string & l : st.pending_lines) {
            emit(st.epoch, l);
        }
        emit(st.epoch, st.pending_end);
        if (const int64_t us = g_llama_instr_write_delay_us.load(std::memory_order_relaxed)) {
            std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        host_log_part(st, t_synced, "log");
    } catch (...) {
        st.pending_lines.clear();
        step_abandon(st, "llama_instr_synchronized");
        return;
    }
    st.pending_lines.clear();
    step_done(st);
}

// the positions the batch's tokens take (without them, the ones after its context's sequence 0)
void batch_positions(llama_context * ctx, const llama_batch & batch, int64_t & p0, int64_t & p1) {
    if (batch.pos && batch.n_tokens > 0) {
        p0 = p1 = batch.pos[0];
        for (int i = 1; i < batch.n_tokens; i++) {
            p0 = std::min<int64_t>(p0, batch.pos[i]);
            p1 = std::max<int64_t>(p1, batch.pos[i]);
        }
    } else {
        llama_memory_t mem = llama_get_memory(ctx);
        p0                 = mem ? llama_memory_seq_pos_max(mem, 0) + 1 : 0;
        p1                 = p0 + std::max(0, batch.n_tokens - 1);
    }
}

// per sequence (a token's first sequence id): tokens and positions, in order of appearance
void note_seqs(ctx_state & st, const llama_batch & batch) {
    st.seqs.clear();
    if (!batch.seq_id || !batch.n_seq_id || !batch.pos) {
        return;
    }
    for (int i = 0; i < batch.n_tokens; i++) {
        const int32_t seq = batch.n_seq_id[i] > 0 ? batch.seq_id[i][0] : 0;
        auto          it =
            std::find_if(st.seqs.begin(), st.seqs.end(), [seq](const ctx_state::seq_info & q) { return q.seq == seq; });
        if (it == st.seqs.end()) {
            st.seqs.push_back({ seq, 0, batch.pos[i], batch.pos[i] });
            it = st.seqs.end() - 1;
        }
        it->n_tokens++;
        it->pos0 = std::min<int64_t>(it->pos0, batch.pos[i]);
        it->pos1 = std::max<int64_t>(it->pos1, batch.pos[i]);
    }
}

// the outputs a batch asks for (without its flags, the last token's)
int64_t batch_outputs(const llama_batch & batch) {
    if (!batch.logits) {
        return batch.n_tokens > 0 ? 1 : 0;
    }
    int64_t n = 0;
    for (int i = 0; i < batch.n_tokens; i++) {
        n += batch.logits[i] != 0;
    }
    return n;
}

// the cells of the context's cache sequence 0 takes (-1: no memory)
int64_t kv_used_of(llama_context * ctx) {
    llama_memory_t mem = llama_get_memory(ctx);
    if (!mem) {
        return -1;
    }
    const llama_pos pmax = llama_memory_seq_pos_max(mem, 0);
    const llama_pos pmin = llama_memory_seq_pos_min(mem, 0);
    return pmax >= 0 && pmin >= 0 ? (int64_t) pmax - pmin + 1 : 0;
}

// The RPC commands the step sent (its inputs, graphs and outputs): written now, or kept to be
// written with the step's other records when they wait for the host's synchronization.
void write_decode_transfers(ctx_state & st, llama_context * ctx, int64_t t_start, bool pending) {
    std::vector<std::string> rpc_lines;
    rpc_step_lines(ctx, ctx->get_sched(), st.sid, st.id, st.step, t_start, rpc_lines);
    if (pending) {
        st.pending_lines = std::move(rpc_lines);
    }
    for (const std::string & l : rpc_lines) {
        emit(st.epoch, l);
    }
}

}  // namespace

// A context's free, whatever the level: its step whose records waited for a synchronization (its
// owner paused recording, so that the destructor's synchronize wrote nothing) is written, since
// the destructor synchronized; then the context's last records, and its state goes.
void llama_instr_context_free(const llama_context * ctx) {
    ctx_state * st = ctx_find(ctx);
    if (st && st->step_pending) {
        write_pending_step(*st, now_ns());
    }
    context_forget(ctx);
}

void llama_instr_synchronized(llama_context * ctx, int64_t t_begin) {
    const int64_t t_synced = now_ns();
    ctx_state *   st       = ctx_find(ctx);
    if (st && st->step_pending) {
        write_pending_step(*st, t_synced);
    }
    if (st) {
        perf_seen(*st, ctx);
    }
    // a sampling that reads the outputs synchronizes inside its scope: the device's remaining work
    // is the step's (its computes' `wait`), the records' writing the logger's
    sampling_exclude(t_begin, now_ns());
}

int64_t llama_instr_decode_begin(llama_context * ctx, const llama_batch & batch) {
    int64_t     t_entry = now_ns();
    ctx_state * stp     = ctx_get(ctx);
    if (!stp) {
        return 0;  // out of memory: this step is not recorded
    }
    ctx_state & st = *stp;
    if (st.step_pending) {
        // decoding again without reading the last step's outputs: its records wait no longer (the
        // device's remaining work is that step's, its writing the logger's after it)
        synchronize_backends(ctx);
        write_pending_step(st, now_ns());
        t_entry = now_ns();
    }
    bool begun = false;  // its step_begin written
    try {
        int64_t p0 = 0, p1 = 0;
        batch_positions(ctx, batch, p0, p1);
        const bool prompt = batch.n_tokens > 1 || p0 == 0;
        note_seqs(st, batch);
        if (!step_join(st, batch.n_tokens, prompt)) {
            return 0;  // the session ended meanwhile
        }
        st.media       = st.media_next;
        st.media_slice = st.media_slice_next;
        write_decode_begin(st, ctx, batch, p0, p1, prompt);
        begun = true;
        // what the host did since the context's last step (this hook's work included)
        host_step_begin(st, t_entry);
    } catch (...) {
        if (!begun) {
            // its step_begin is not written: the step is abandoned, and llama_decode's return writes
            // nothing of it (no end is called for a begin that returns 0)
            step_abandon(st, "llama_instr_decode_begin");
            return 0;
        }
        hook_failed(st.epoch, "llama_instr_decode_begin");
    }
    return now_ns();
}

void llama_instr_decode_end(llama_context * ctx, const llama_batch & batch, int32_t ret, int64_t t_start) {
    const int64_t t_end   = now_ns();
    const int64_t cpu_end = thread_cpu_ns();  // the next window's CPU time starts here
    ctx_state *   stp     = ctx_get(ctx);
    if (!stp) {
        return;
    }
    ctx_state & st = *stp;
    st.in_decode   = false;
    try {
        const int64_t n_outputs = batch_outputs(batch);
        const int64_t n_vocab   = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
        const int64_t kv_used   = kv_used_of(ctx);

        // a step whose devices' times are read once the host synchronizes is written then
        // (write_pending_step); VERBOSE synchronized after each compute (its logits are read here)
        const bool pending = st.device_pending;
        st.device_pending  = false;
        if (!pending) {
            write_step_computes(st);
        }
        write_decode_transfers(st, ctx, t_start, pending);

        // every record of a step precedes its step_end, so a reader can close the step there
        if (!pending && st.level >= LLAMA_INSTR_LEVEL_VERBOSE && ret == 0 && n_outputs > 0) {
            write_topk(st, ctx, n_outputs, n_vocab);
        }

        format_step_end(st, { t_start, t_end, ret, batch.n_tokens, n_outputs, kv_used }, [&](json_out & j) {
            write_step_output(j, n_vocab, n_outputs);
            if (env_device(st.epoch).step_memory) {
                write_step_memory(j, ctx);
            }
        });
        if (pending) {
            // written at the synchronization (write_pending_step); the host's window after it
            // begins now, as for any step
            st.pending_end  = st.line;
            st.step_pending = true;
            step_deferred(st);
            host_step_end(st, ctx, batch, cpu_end);
            host_log_part(st, t_end, "log");
            return;
        }
        emit(st.epoch, st.line);
        host_step_end(st, ctx, batch, cpu_end);
        step_done(st);
        host_log_part(st, t_end, "log");  // this hook's work after the step, the first of the next window's
    } catch (...) {
        st.device_pending = false;
        st.step_pending   = false;
        st.pending_lines.clear();
        step_abandon(st, "llama_instr_decode_end");
    }
}
