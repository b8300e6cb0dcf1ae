// llamacpp-instr: images and sounds (tools/mtmd). Each medium tokenized is a `media` record; each
// encoder (a clip context) is a context of its own whose steps are its encodes, timed like a
// decode's (the op timers of its scheduler's backends, its graph's node table, its blocks as
// layers); a step that decodes a medium's embeddings names it (llama_instr_set_media). An
// encode lives a step's life as a decode does (llama-instr-step.h: its begin, its end, its
// abandon); this file holds what is an encoder's own: its hooks, its state, its steps' fields.
//
// An encoder's state lives in the registry beside the llama_contexts', keyed by its address, from
// llama_instr_encoder_describe until llama_instr_encoder_free. mtmd encodes on the thread that
// calls it: what the next encode serves and encodes is told on that thread beforehand.

#include "llama-instr-hooks.h"
#include "llama-instr-registry.h"
#include "llama-instr-rpc.h"
#include "llama-instr-step.h"
#include "llama-instr-timing.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>

using namespace llama_instr;

namespace {

constexpr int32_t MAX_ENCODE_MEDIA = 64;  // media slices an encode names (more are counted, not named)
constexpr size_t  LOADS_KEPT       = 64;  // loads noted and not yet claimed by a medium

const char * const k_media_kinds[] = { "image", "audio" };

// what the next encode on this thread serves and encodes
struct encode_next {
    const llama_context * ctx = nullptr;
    int32_t               seq = -1;
    int32_t               n   = 0;  // media slices told (may exceed MAX_ENCODE_MEDIA)
    int64_t               media[MAX_ENCODE_MEDIA];
    int32_t               slice[MAX_ENCODE_MEDIA];
    int32_t               n_tokens = 0;
};

thread_local encode_next t_next;
thread_local ctx_state * t_encoding = nullptr;  // the encoder whose encode this thread runs

// a medium's load (llama_instr_media_loaded), noted in a session until a medium claims it
struct load_note {
    const void * bitmap  = nullptr;
    uint64_t     epoch   = 0;  // the session it was noted in
    int64_t      t_start = 0, dur = 0;
};

std::mutex & loads_mtx() {
    static std::mutex * m = new std::mutex;
    return *m;
}

load_note g_loads[LOADS_KEPT];
size_t    g_loads_next = 0;

std::atomic<int64_t> g_media_ids{ 0 };

const llama_context * key_of(const void * encoder) noexcept {
    return static_cast<const llama_context *>(encoder);  // a registry key only, never a context
}

// The state of `encoder`, if it was described (nullptr otherwise, or out of memory).
ctx_state * encoder_state(const void * encoder) noexcept {
    ctx_state * st = encoder ? ctx_find(key_of(encoder)) : nullptr;
    return st && st->encoder ? st : nullptr;
}

// The request sequence `seq` of `ctx` serves, or its context's ("": none).
std::string request_of(const llama_context * ctx, int32_t seq) {
    ctx_state * st = ctx ? ctx_find(ctx) : nullptr;
    return st ? seq_request(*st, seq) : std::string();
}

void write_context(ctx_state & st) {
    const encoder_info & e = *st.encoder;
    json_out             j{ st.line };
    record_head(j, "context", now_ns(), st.sid);
    j.key("ctx");
    j.i64(st.id);
    j.key("role");
    j.str("encoder");
    j.key("model");
    j.raw("{\"architecture\":");
    j.str(e.projector);
    j.raw(",\"n_layer\":");
    j.i64(e.n_layer);
    j.ch('}');
    j.key("encoder");
    j.raw("{\"modality\":");
    j.str(k_media_kinds[e.modality]);
    j.raw(",\"n_embd\":");
    j.i64(e.n_embd);
    j.raw(",\"n_embd_out\":");
    j.i64(e.n_embd_out);
    if (e.image_size > 0) {
        j.raw(",\"image_size\":");
        j.i64(e.image_size);
        j.raw(",\"patch_size\":");
        j.i64(e.patch_size);
    }
    j.raw("}}");
    emit(st.epoch, st.line);
}

// an encode's step_begin: a step's fields, then the media slices it encodes, the context and
// sequence it serves, and whether it is its encoder's first
void write_encode_begin(ctx_state & st, const encode_next & next) {
    write_step_begin(st, { "encode", next.n_tokens, 0, std::max(0, next.n_tokens - 1) }, [&](json_out & j) {
        j.key("media");
        j.ch('[');
        for (int32_t i = 0; i < std::min(next.n, MAX_ENCODE_MEDIA); i++) {
            j.sep();
            j.ch('[');
            j.i64(next.media[i]);
            j.ch(',');
            j.i64(next.slice[i]);
            j.ch(']');
        }
        j.ch(']');
        if (next.n > MAX_ENCODE_MEDIA) {
            j.key("media_more");
            j.i64(next.n - MAX_ENCODE_MEDIA);
        }
        if (const ctx_state * target = next.ctx ? ctx_find(next.ctx) : nullptr) {
            if (target->epoch == st.epoch) {
                j.key("target");
                j.ch('[');
                j.i64(target->id);
                j.ch(',');
                j.i64(next.seq);
                j.ch(']');
            }
        }
        j.key("first");
        j.boolean(st.encoder->n_encodes == 0);
    });
}

// mtmd has read the embeddings: the backends are done, the computes' times can be read now
void encode_synced(ctx_state & st) {
    if (st.encoder->sched) {
        ggml_backend_sched_synchronize(st.encoder->sched);
    }
    const int64_t t_synced = now_ns();
    for (compute_rec & c : st.p_computes) {
        c.t_synced = std::max(c.t_synced, t_synced);
    }
    st.device_pending = false;
}

// The load of `bitmap` noted last, in session `epoch` or with no session open (a program may load
// its media before it opens one); every note of that address is dropped with it (an address is
// reused once its bitmap is freed: an older note of it is another bitmap's). None (bitmap null)
// when there is none.
load_note take_load(const void * bitmap, uint64_t epoch) {
    load_note                   load;
    std::lock_guard<std::mutex> lock(loads_mtx());
    for (size_t k = 0; k < LOADS_KEPT && k < g_loads_next; k++) {
        load_note & l = g_loads[(g_loads_next - 1 - k) % LOADS_KEPT];
        if (l.bitmap == bitmap) {
            if (!load.bitmap && (l.epoch == epoch || l.epoch == 0)) {
                load = l;
            }
            l = load_note{};
        }
    }
    return load;
}

// The RPC commands the encode sent (its input, its graph, its embeddings' read), which its encoder
// owns, written before its step_end as a decode step's are (no decode step takes them).
void write_encode_transfers(ctx_state & st, const void * encoder, int64_t t_start) {
    std::vector<std::string> lines;
    rpc_step_lines(key_of(encoder), st.encoder->sched, st.sid, st.id, st.step, t_start, lines);
    for (const std::string & l : lines) {
        emit(st.epoch, l);
    }
}

// The open session's epoch (0: none open). May throw (the lock).
uint64_t open_epoch() {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    return s.log.fp ? s.epoch : 0;
}

// Emit a record of the open session made by `fill` after its head (under the session lock).
template <typename F> bool emit_session_record(const char * type, F && fill) {
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (!s.log.fp) {
        return false;
    }
    if (s.n_open_steps == 0 && file_due_locked(s)) {
        new_file_locked(s);
    }
    std::string line;
    json_out    j{ line };
    record_head(j, type, now_ns(), s.sid);
    fill(j);
    j.ch('}');
    s.log.emit(line);
    return true;
}

}  // namespace

//
// encoders
//

int32_t llama_instr_encoder_describe(const void * encoder, const llama_instr_encoder_desc * desc) noexcept {
    if (!encoder || !desc) {
        return LLAMA_INSTR_ERR_INVALID_ARG;
    }
    try {
        ctx_state * st = ctx_get(key_of(encoder));
        if (!st) {
            return LLAMA_INSTR_ERR_INTERNAL;
        }
        auto e        = std::make_unique<encoder_info>();
        e->projector  = desc->projector ? std::string(desc->projector).substr(0, 64) : "unknown";
        e->modality   = desc->modality == LLAMA_INSTR_MEDIA_AUDIO ? LLAMA_INSTR_MEDIA_AUDIO : LLAMA_INSTR_MEDIA_IMAGE;
        e->n_layer    = std::max(0, desc->n_layer);
        e->n_embd     = std::max(0, desc->n_embd);
        e->n_embd_out = std::max(0, desc->n_embd_out);
        e->image_size = std::max(0, desc->image_size);
        e->patch_size = std::max(0, desc->patch_size);
        st->encoder   = std::move(e);
        return LLAMA_INSTR_OK;
    } catch (...) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
}

void llama_instr_encoder_free(const void * encoder) noexcept {
    if (encoder) {
        llama_instr_context_free(key_of(encoder));
    }
}

int64_t llama_instr_encode_begin(const void * encoder, int32_t n_threads) noexcept {
    const int64_t t_entry = now_ns();
    encode_next   next    = t_next;
    t_next                = encode_next{};
    if (!llama_instr_enabled()) {
        return 0;
    }
    ctx_state * stp = encoder_state(encoder);
    if (!stp || stp->in_decode) {
        return 0;
    }
    ctx_state & st = *stp;
    try {
        const std::string request = request_of(next.ctx, next.seq);
        if (!step_join(st, 0, false)) {
            return 0;
        }
        st.ubatch_tokens      = next.n_tokens;  // its one compute's (no ubatch hook tells)
        st.request            = request;
        st.encoder->n_threads = n_threads;
        st.graph.il_of.clear();
        if (st.encoder->described != st.epoch) {
            st.encoder->described = st.epoch;
            write_context(st);
        }
        write_encode_begin(st, next);
        t_encoding = &st;
        // the RPC commands this thread issues until the encode's end are the encoder's (mtmd sends
        // the encode's input before its compute begins)
        rpc_set_owner(key_of(encoder));
    } catch (...) {
        // a start that failed partway records nothing of this encode: the step it opened ends
        // now, so that the encoder's next encode is recorded and the log can rotate
        t_encoding = nullptr;
        step_abandon(st, "llama_instr_encode_begin");
        return 0;
    }
    const int64_t t_start     = now_ns();
    st.encoder->t_entry_begin = t_entry;
    return t_start;
}

void llama_instr_encode_graph_begin(const void * encoder) noexcept {
    ctx_state * st = encoder_state(encoder);
    if (st && st->in_decode && st == t_encoding) {
        st->graph.il_of.clear();
    }
}

void llama_instr_encode_graph_cb(ggml_tensor * cur, int32_t il) noexcept {
    ctx_state * st = t_encoding;
    if (!st) {
        return;
    }
    // as named: which are blocks is known once the graph is built (encoder_layers)
    try {
        st->graph.il_of.emplace_back(cur, il);
    } catch (...) {
        hook_failed(st->epoch, "llama_instr_encode_graph_cb");
    }
}

void llama_instr_encode_graph_built(const void * encoder, ggml_backend_sched_t sched, ggml_cgraph * gf) noexcept {
    ctx_state * st = encoder_state(encoder);
    if (st && st->in_decode && st == t_encoding) {
        encoder_layers(st->graph.il_of, st->encoder->n_layer);
        graph_built(*st, sched, gf, nullptr);
    }
}

void llama_instr_encode_compute_begin(const void * encoder, ggml_backend_sched_t sched, ggml_cgraph * gf) noexcept {
    ctx_state * st = encoder_state(encoder);
    if (!st || !st->in_decode || st != t_encoding || !sched) {
        return;
    }
    st->encoder->sched = sched;
    compute_begin(*st, nullptr, sched, gf, nullptr, -1);
}

void llama_instr_encode_compute_end(const void * encoder, int32_t status) noexcept {
    ctx_state * st = encoder_state(encoder);
    if (st && st->sched_profiling && st == t_encoding) {
        compute_end(*st, st->encoder->sched, status);
    }
}

void llama_instr_encode_end(const void * encoder,
                            int64_t      t_start,
                            int32_t      n_tokens,
                            int32_t      n_embd,
                            int32_t      status) noexcept {
    const int64_t t_end = now_ns();
    ctx_state *   stp   = encoder_state(encoder);
    if (!stp || !stp->in_decode || stp != t_encoding) {
        return;
    }
    ctx_state & st = *stp;
    t_encoding     = nullptr;
    st.in_decode   = false;
    st.encoder->n_encodes++;
    try {
        if (st.device_pending) {
            encode_synced(st);
        }
        write_step_computes(st);
        write_encode_transfers(st, encoder, t_start);
        const int64_t n_out = std::max(0, n_tokens);
        format_step_end(st, { t_start, t_end, status, n_out, n_out, -1 }, [&](json_out & j) {
            // the logger's work in the encode's call but not in its dur: its records at its start
            // and, at its end, its graph tables and computes (written above)
            j.key("log_ns");
            j.i64(std::max<int64_t>(0, t_start - st.encoder->t_entry_begin) + std::max<int64_t>(0, now_ns() - t_end));
            write_step_output(j, std::max(0, n_embd), n_out);  // the encode's output: its embeddings
        });
        emit(st.epoch, st.line);
    } catch (...) {
        rpc_set_owner(nullptr);
        step_abandon(st, "llama_instr_encode_end");
        return;
    }
    step_done(st);
}

//
// media
//

int64_t llama_instr_clock(void) noexcept {
    return now_ns();
}

uint64_t llama_instr_hash_bytes(const void * data, size_t n) noexcept {
    const unsigned char * p = static_cast<const unsigned char *>(data);
    uint64_t              h = 0x9E3779B97F4A7C15ull ^ (uint64_t) n;
    size_t                i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    if (n > i) {
        memcpy(&w, p + i, n - i);
    }
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

void llama_instr_media_loaded(const void * bitmap, int64_t t_start) noexcept {
    if (!bitmap || !t_start) {
        return;
    }
    const int64_t t_end = now_ns();
    try {
        const uint64_t              epoch = open_epoch();
        std::lock_guard<std::mutex> lock(loads_mtx());
        g_loads[g_loads_next % LOADS_KEPT] = { bitmap, epoch, t_start, t_end - t_start };
        g_loads_next++;
    } catch (...) {
        // the lock failed: the medium is recorded without its load
    }
}

void llama_instr_media_unloaded(const void * bitmap) noexcept {
    if (!bitmap) {
        return;
    }
    try {
        take_load(bitmap, 0);
    } catch (...) {
        // the lock failed: a later bitmap at this address may be given this one's load
    }
}

int64_t llama_instr_media_add(const llama_instr_media_desc * d) noexcept {
    const int64_t t_end = now_ns();
    if (!d) {
        return LLAMA_INSTR_ERR_INVALID_ARG;
    }
    if (!llama_instr_enabled()) {
        return 0;
    }
    try {
        const load_note load = d->bitmap ? take_load(d->bitmap, open_epoch()) : load_note{};
        const uint64_t  hash = d->data && d->n_bytes > 0 ? llama_instr_hash_bytes(d->data, d->n_bytes) : 0;
        const int64_t   id   = g_media_ids.fetch_add(1, std::memory_order_relaxed) + 1;
        const bool      ok   = emit_session_record("media", [&](json_out & j) {
            j.key("id");
            j.i64(id);
            j.key("kind");
            j.str(k_media_kinds[d->kind == LLAMA_INSTR_MEDIA_AUDIO ? 1 : 0]);
            j.key("nx");
            j.i64(d->nx);
            j.key("ny");
            j.i64(d->ny);
            if (d->n_frames > 1) {
                j.key("frames");
                j.i64(d->n_frames);
            }
            j.key("bytes");
            j.i64((int64_t) d->n_bytes);
            char hex[20];
            snprintf(hex, sizeof(hex), "%016" PRIx64, hash);
            j.key("hash");
            j.str(hex);
            j.key("slices");
            j.i64(std::max(0, d->n_slices));
            j.key("tokens");
            j.i64(std::max(0, d->n_tokens));
            j.key("n_pos");
            j.i64(std::max(0, d->n_pos));
            if (load.bitmap) {
                j.key("load");
                j.ch('[');
                j.i64s({ load.t_start, load.dur });
                j.ch(']');
            }
            if (d->t_preprocess > 0) {
                j.key("preprocess");
                j.ch('[');
                j.i64s({ d->t_preprocess, std::max<int64_t>(0, t_end - d->t_preprocess) });
                j.ch(']');
            }
        });
        return ok ? id : 0;
    } catch (...) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
}

void llama_instr_media_for(llama_context * ctx, int32_t seq) noexcept {
    t_next.ctx = ctx;
    t_next.seq = seq;
}

void llama_instr_media_encoding(const int64_t * media, const int32_t * slices, int32_t n, int32_t n_tokens) noexcept {
    encode_next & next = t_next;
    next.n             = std::max(0, n);
    next.n_tokens      = std::max(0, n_tokens);
    for (int32_t i = 0; media && i < std::min(next.n, MAX_ENCODE_MEDIA); i++) {
        next.media[i] = media[i];
        next.slice[i] = slices ? slices[i] : 0;
    }
    if (!media) {
        next.n = 0;
    }
}

void llama_instr_set_media(llama_context * ctx, int64_t media, int32_t slice) noexcept {
    if (!ctx) {
        return;
    }
    ctx_state * st = media > 0 || llama_instr_enabled() ? ctx_get(ctx) : ctx_find(ctx);
    if (st) {
        st->media_next       = std::max<int64_t>(0, media);
        st->media_slice_next = media > 0 ? slice : 0;
    }
}
