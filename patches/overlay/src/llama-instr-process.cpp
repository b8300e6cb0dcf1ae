// llamacpp-instr: the step hooks around llama_process's decode (see llama-instr-process.h).

#include "llama-instr-process.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-instr-hooks.h"

#include <vector>

int32_t llama_instr_process_decode(llama_context * ctx, llama_batch_ext & batch) {
    // the batch as a llama_batch, for the hooks only (they read ids, positions, first sequence
    // ids and output flags); an embeddings batch shows no token ids, as llama_decode's would
    const size_t                n = batch.tokens.size();
    std::vector<llama_token>    token(n);
    std::vector<llama_pos>      pos(n);
    std::vector<int32_t>        n_seq_id(n);
    std::vector<llama_seq_id>   first_seq(n);
    std::vector<llama_seq_id *> seq_id(n);
    std::vector<int8_t>         logits(n);
    bool                        embd = false;
    for (size_t i = 0; i < n; i++) {
        const auto & t = batch.tokens[i];
        token[i]       = t.id;
        embd           = embd || t.has_embd;
        pos[i]         = t.pos[0];
        n_seq_id[i]    = t.seq_ids.empty() ? 0 : 1;
        llama_seq_id s = 0;
        bool         f = true;
        for (llama_seq_id q : t.seq_ids) {  // the lowest: unordered_set has no order of its own
            s = f || q < s ? q : s;
            f = false;
        }
        first_seq[i] = s;
        seq_id[i]    = &first_seq[i];
        logits[i]    = t.output ? 1 : 0;
    }
    llama_batch view = {};
    view.n_tokens    = (int32_t) n;
    view.token       = embd ? nullptr : token.data();
    view.pos         = pos.data();
    view.n_seq_id    = n_seq_id.data();
    view.seq_id      = seq_id.data();
    view.logits      = logits.data();

    const int64_t t_instr = llama_instr_decode_begin(ctx, view);
    const int32_t ret     = ctx->decode(batch);
    if (t_instr) {
        llama_instr_decode_end(ctx, view, ret, t_instr);
    }
    return ret;
}
