#include "llama-instr-experts.h"

#include "llama-context.h"
#include "llama-instr-json.h"
#include "llama-model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace llama_instr {

namespace {

constexpr char    ARGSORT_NAME[] = "ffn_moe_argsort-";
constexpr char    PROBS_NAME[]   = "ffn_moe_probs-";
// bounds a reader can rely on (a larger model is not recorded)
constexpr int32_t MAX_EXPERTS    = 65536;
constexpr int32_t MAX_LAYERS     = 4096;

// the layer of an `ffn_moe_argsort-<il>` node, or -1
int32_t argsort_layer(const ggml_tensor * t) {
    if (strncmp(t->name, ARGSORT_NAME, sizeof(ARGSORT_NAME) - 1) != 0) {
        return -1;
    }
    int32_t      il = 0;
    const char * p  = t->name + sizeof(ARGSORT_NAME) - 1;
    if (*p < '0' || *p > '9') {
        return -1;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        il = il * 10 + (*p - '0');
        if (il >= MAX_LAYERS) {
            return -1;
        }
    }
    return *p == '\0' ? il : -1;
}

}  // namespace

namespace {

// Grow a and b to at least n entries each, both or neither: a failed allocation (std::bad_alloc)
// leaves them as they were, so that a tally never indexes one past the other's end. Grown, every
// entry is fill_a / fill_b.
template <typename A, typename B> void grow_pair(std::vector<A> & a, std::vector<B> & b, size_t n, A fill_a, B fill_b) {
    if (a.size() >= n && b.size() >= n) {
        return;
    }
    std::vector<A> na(n, fill_a);
    std::vector<B> nb(n, fill_b);
    a.swap(na);
    b.swap(nb);
}

}  // namespace

bool expert_log::arm(const llama_context * ctx, int32_t n_tokens, bool verbose) {
    reset();           // a compute that was not collected
    n_expert = 0;      // until every table below is sized: a throw leaves nothing to tally into
    if (!ctx) {
        return false;  // an encoder's graph (tools/mtmd) routes no experts
    }
    const auto & hp = ctx->get_model().hparams;
    if (hp.n_expert < 2 || (int64_t) hp.n_expert > MAX_EXPERTS || hp.n_layer() == 0 ||
        (int64_t) hp.n_layer() > MAX_LAYERS) {
        return false;
    }
    const int32_t nl = (int32_t) hp.n_layer();
    if ((int32_t) n_used.size() != nl) {
        n_used.resize(nl);
    }
    n_layer = nl;

    // a warmup graph (llama_set_warmup: llama.cpp's programs decode one before the first request)
    // ranks every expert and computes them all, whatever the layer's n_expert_used
    const bool warmup = ctx->get_cparams().warmup;
    max_used          = 0;
    for (int32_t il = 0; il < n_layer; il++) {
        n_used[il] = warmup ? (int32_t) hp.n_expert : (int32_t) std::min<uint32_t>(hp.n_expert_used(il), hp.n_expert);
        max_used   = std::max(max_used, n_used[il]);
    }
    // the tallies (all zero: reset() zeroed every layer seen) and the layers' rows and order
    grow_pair(counts, wsum, (size_t) n_layer * hp.n_expert, 0, 0.0);
    grow_pair(rows, seen, (size_t) n_layer, -1, 0);
    per_token = verbose && n_tokens > 0;
    if (per_token) {
        max_rows = n_tokens;
        grow_pair(tok_ids, tok_w, (size_t) n_layer * n_tokens * std::max(1, max_used), 0, 0.0f);
    }
    n_expert = (int32_t) hp.n_expert;
    return true;
}

int32_t router_layer(const expert_log & log, const ggml_tensor * t) {
    if (t->op != GGML_OP_ARGSORT || t->type != GGML_TYPE_I32 || log.n_expert == 0) {
        return -1;
    }
    const int32_t il = argsort_layer(t);
    if (il < 0 || il >= log.n_layer || t->ne[0] != log.n_expert || t->ne[2] != 1 || t->ne[3] != 1 ||
        log.rows[il] >= 0) {
        return -1;
    }
    return il;
}

namespace {

// what a router's `ffn_moe_probs-<il>` row holds, and so what a chosen expert's weight is
enum class weight_kind {
    none,         // not read (the weights are unknown)
    probability,  // the router's probabilities (softmax or sigmoid gating): the chosen entries
    logit,        // its logits (llama.cpp's softmax-weight gating, gpt-oss: probs = logits, and the
                  // weights are the softmax over the chosen ones, `ffn_moe_weights_softmax`)
};

// one layer's ranking into the tallies: row r's ids at ids_of(r), the row of the router's
// `ffn_moe_probs` it was ranked from at prob_of(r) (null: not read), holding `kind`
template <typename Ids, typename Probs>
void tally(expert_log & log, int32_t il, int32_t n_rows, Ids ids_of, Probs prob_of, weight_kind kind) {
    const int32_t n_used = log.n_used[il];
    int32_t *     counts = log.counts.data() + (size_t) il * log.n_expert;
    double *      wsum   = log.wsum.data() + (size_t) il * log.n_expert;
    const bool    tok    = log.per_token && n_rows <= log.max_rows;
    const size_t  tbase  = (size_t) il * log.max_rows * std::max(1, log.max_used);
    for (int32_t r = 0; r < n_rows; r++) {
        const int32_t * ids  = ids_of(r);
        const float *   prob = kind == weight_kind::none ? nullptr : prob_of(r);
        // logits: the softmax over the chosen ones, shifted by their largest
        float           top = -INFINITY, norm = 0.0f;
        if (prob && kind == weight_kind::logit) {
            for (int32_t k = 0; k < n_used; k++) {
                if (ids[k] >= 0 && ids[k] < log.n_expert) {
                    top = std::max(top, prob[ids[k]]);
                }
            }
            for (int32_t k = 0; k < n_used; k++) {
                if (ids[k] >= 0 && ids[k] < log.n_expert) {
                    norm += expf(prob[ids[k]] - top);
                }
            }
        }
        for (int32_t k = 0; k < n_used; k++) {
            const int32_t e = ids[k];
            if (e < 0 || e >= log.n_expert) {
                continue;
            }
            counts[e]++;
            float w = NAN;
            if (prob) {
                w = kind == weight_kind::logit ? expf(prob[e] - top) / norm : prob[e];
            }
            wsum[e] += w;
            if (tok) {
                log.tok_ids[tbase + (size_t) r * n_used + k] = e;
                log.tok_w[tbase + (size_t) r * n_used + k]   = w;
            }
        }
    }
    log.rows[il]           = n_rows;
    log.seen[log.n_seen++] = il;
}

// what the router's tensor the ranking was made of holds (`ffn_moe_probs-<il>`, which llama.cpp's
// `ffn_moe_weights` gathers); a ranking of anything else (biased or masked probabilities, another
// function of the logits) leaves the weights unread
weight_kind weights_of(const ggml_tensor * p) {
    switch (p->op) {
        case GGML_OP_SOFT_MAX:
            return weight_kind::probability;
        case GGML_OP_UNARY:
            return ggml_get_unary_op(p) == GGML_UNARY_OP_SIGMOID ? weight_kind::probability : weight_kind::none;
        case GGML_OP_MUL_MAT:
        case GGML_OP_ADD:  // (a router with a bias)
            return weight_kind::logit;
        default:
            return weight_kind::none;
    }
}

}  // namespace

void experts_on_node(expert_log & log, const ggml_tensor * t, int ith) {
    if (ith != 0 || !t->data) {
        return;
    }
    const int32_t il = router_layer(log, t);
    if (il < 0) {
        return;
    }
    const int32_t       n_rows = (int32_t) std::min<int64_t>(t->ne[1], INT32_MAX);
    const ggml_tensor * p      = t->src[0];
    const bool pw = p && p->data && p->type == GGML_TYPE_F32 && p->nb[0] == sizeof(float) && p->ne[0] == log.n_expert &&
                    p->ne[1] == t->ne[1] && strncmp(p->name, PROBS_NAME, sizeof(PROBS_NAME) - 1) == 0;
    tally(
        log, il, n_rows, [t](int32_t r) { return (const int32_t *) ((const char *) t->data + (size_t) r * t->nb[1]); },
        [p](int32_t r) { return (const float *) ((const char *) p->data + (size_t) r * p->nb[1]); },
        pw ? weights_of(p) : weight_kind::none);
}

void experts_on_ids(expert_log & log, int32_t il, const int32_t * ids, int32_t n_rows, size_t stride) {
    if (il < 0 || il >= log.n_layer || log.n_expert == 0 || log.rows[il] >= 0 || n_rows < 0 ||
        stride < (size_t) log.n_used[il]) {
        return;
    }
    tally(
        log, il, n_rows, [ids, stride](int32_t r) { return ids + (size_t) r * stride; },
        [](int32_t) { return (const float *) nullptr; }, weight_kind::none);
}

void expert_log::reset() {
    for (int32_t s = 0; s < n_seen; s++) {
        const int32_t il = seen[s];
        std::fill_n(counts.begin() + (size_t) il * n_expert, n_expert, 0);
        std::fill_n(wsum.begin() + (size_t) il * n_expert, n_expert, 0.0);
        rows[il] = -1;
    }
    n_seen = 0;
}

namespace {

// room for n more entries in v, grown as push_back grows it (doubling)
template <typename T> void reserve_more(std::vector<T> & v, size_t n) {
    if (v.capacity() - v.size() < n) {
        v.reserve(std::max(v.size() + n, 2 * v.capacity()));
    }
}

}  // namespace

void expert_log::collect() {
    for (int32_t s = 0; s < n_seen; s++) {
        const int32_t il = seen[s];
        int32_t *     c  = counts.data() + (size_t) il * n_expert;
        double *      w  = wsum.data() + (size_t) il * n_expert;
        for (int32_t e = 0; e < n_expert; e++) {
            if (c[e] > 0) {
                p_rows.push_back({ il, e, c[e], w[e] });
            }
            c[e] = 0;
            w[e] = 0.0;
        }
        if (per_token && rows[il] <= max_rows) {
            const int32_t nu    = n_used[il];
            const size_t  tbase = (size_t) il * max_rows * std::max(1, max_used);
            const size_t  n     = (size_t) rows[il] * nu;
            // room for the block in all three first (each may throw std::bad_alloc), then the
            // appends, which cannot: a block always has its ids and weights, at the same offsets
            reserve_more(p_tok_ids, n);
            reserve_more(p_tok_w, n);
            reserve_more(p_tok, 1);
            p_tok.push_back({ il, rows[il], nu, p_tok_ids.size() });
            p_tok_ids.insert(p_tok_ids.end(), tok_ids.begin() + tbase, tok_ids.begin() + tbase + n);
            p_tok_w.insert(p_tok_w.end(), tok_w.begin() + tbase, tok_w.begin() + tbase + n);
        }
        rows[il] = -1;
    }
    n_seen = 0;
}

// the routing's counts, rows [row_begin, row_end) of the log: [layer, expert, tokens, weight]
static void write_expert_rows(json_out & j, const expert_log & log, size_t row_begin, size_t row_end) {
    j.key("rows");
    j.ch('[');
    json_rows out{ j };
    for (size_t k = row_begin; k < row_end; k++) {
        const expert_row & r = log.p_rows[k];
        out.row();
        out.i64(r.layer);
        out.ch(',');
        out.i64(r.expert);
        out.ch(',');
        out.i64(r.tokens);
        out.ch(',');
        out.f32(r.weight);  // NaN (not read): null
        out.ch(']');
    }
    out.ch(']');
    out.flush();
}

// each token's experts, blocks [tok_begin, tok_end) of the log, per layer: [layer, n_used, [expert
// ids, token by token], [their weights]]
static void write_expert_tokens(json_out & j, const expert_log & log, size_t tok_begin, size_t tok_end) {
    j.key("tokens");
    j.ch('[');
    for (size_t b = tok_begin; b < tok_end; b++) {
        const expert_log::tok_block & tb = log.p_tok[b];
        j.sep();
        j.ch('[');
        j.i64(tb.layer);
        j.ch(',');
        j.i64(tb.n_used);
        j.raw(",[");
        const size_t n = (size_t) tb.n_rows * tb.n_used;
        for (size_t i = 0; i < n; i++) {
            if (i) {
                j.ch(',');
            }
            j.i64(log.p_tok_ids[tb.begin + i]);
        }
        j.raw("],[");
        for (size_t i = 0; i < n; i++) {
            if (i) {
                j.ch(',');
            }
            j.f32(log.p_tok_w[tb.begin + i]);
        }
        j.raw("]]");
    }
    j.ch(']');
}

void write_experts(json_out &          j,
                   const expert_log &  log,
                   const std::string & sid,
                   int32_t             ctx_id,
                   int64_t             step,
                   int32_t             ubatch,
                   int32_t             graph_id,
                   int64_t             ts,
                   size_t              row_begin,
                   size_t              row_end,
                   size_t              tok_begin,
                   size_t              tok_end,
                   int64_t             read_dur) {
    record_head(j, "experts", ts, sid);
    j.key("ctx");
    j.i64(ctx_id);
    j.key("step");
    j.i64(step);
    j.key("ubatch");
    j.i64(ubatch);
    j.key("graph");
    j.i64(graph_id);
    j.key("n_expert");
    j.i64(log.n_expert);
    j.key("n_layer");
    j.i64(log.n_layer);
    if (read_dur >= 0) {
        j.key("read_dur");
        j.i64(read_dur);
    }
    write_expert_rows(j, log, row_begin, row_end);
    if (tok_end > tok_begin) {
        write_expert_tokens(j, log, tok_begin, tok_end);
    }
    j.ch('}');
}

}  // namespace llama_instr
