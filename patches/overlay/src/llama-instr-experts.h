#pragma once

// llamacpp-instr: which experts a mixture-of-experts model routed each token to (DETAILED: per
// compute, layer and expert, the tokens routed and the sum of their routing weights; VERBOSE:
// also each token's experts). Read from the router's ranking that llama.cpp builds anyway (the
// ARGSORT node `ffn_moe_argsort-<il>`, whose first n_expert_used entries per token are
// `ffn_moe_topk-<il>`): on the CPU backend in the CPU op timer's per-node callback (patch 0001's
// on_node), while that node's output is intact; on Vulkan, copied into host memory in the command
// buffer that computes it (patch 0006's profiler reads) and tallied once the graph is done, the
// weights not read there. A layer whose router runs on another backend is not seen, and nothing
// is written for it.

#include "ggml.h"

#include <cstdint>
#include <string>
#include <vector>

struct llama_context;

namespace llama_instr {

struct json_out;

struct expert_row {
    int32_t layer, expert, tokens;
    double  weight;  // sum of the tokens' routing weights (experts.cpp: weights_of; NaN: not read)
};

struct expert_log {
    // the model's routing shape (set at arm; n_expert 0 = not a mixture of experts)
    int32_t              n_expert = 0;
    int32_t              n_layer  = 0;
    std::vector<int32_t> n_used;  // per layer

    // this compute's tallies (sized at arm, only ever grown, each pair together): [layer * n_expert + expert]
    std::vector<int32_t> counts;
    std::vector<double>  wsum;
    std::vector<int32_t> rows;            // per layer: the tokens (rows) its router ranked, -1 unseen
    std::vector<int32_t> seen;            // the layers seen this compute, in order
    int32_t              n_seen     = 0;  // filled entries of `seen`
    bool                 weights_ok = true;

    // VERBOSE: each token's experts, [layer][row][slot] (max_rows rows per layer)
    bool                 per_token = false;
    int32_t              max_rows  = 0;
    int32_t              max_used  = 0;
    std::vector<int32_t> tok_ids;
    std::vector<float>   tok_w;

    // the step's rows, compute after compute (compute_rec::expert_begin/end index them)
    std::vector<expert_row> p_rows;

    struct tok_block {
        int32_t layer, n_rows, n_used;
        size_t  begin;  // into p_tok_ids / p_tok_w
    };

    std::vector<tok_block> p_tok;
    std::vector<int32_t>   p_tok_ids;
    std::vector<float>     p_tok_w;

    // Before a compute: size the tallies for ctx's model and n_tokens rows. False when the model
    // has no experts (then the callback is not needed for routing).
    bool arm(const llama_context * ctx, int32_t n_tokens, bool verbose);

    // after the compute: the tallies into the step's rows (and reset for the next compute)
    void collect();
    // the tallies of the layers seen back to zero
    void reset();

    void clear_step() {
        p_rows.clear();
        p_tok.clear();
        p_tok_ids.clear();
        p_tok_w.clear();
    }
};

// on_node, for every (possibly fused) op's output: tallies an `ffn_moe_argsort-<il>` node
// (thread 0 only; nothing allocated)
void experts_on_node(expert_log & log, const ggml_tensor * node, int ith);

// the layer of a router's ranking not tallied yet in this compute (an ARGSORT node
// `ffn_moe_argsort-<il>` of the model's shape), or -1
int32_t router_layer(const expert_log & log, const ggml_tensor * t);

// a router's ranking read back from a device (row r's ids at ids + r * stride, its first n_used
// the chosen ones), tallied as experts_on_node does; the weights are not read
void experts_on_ids(expert_log & log, int32_t il, const int32_t * ids, int32_t n_rows, size_t stride);

// one `experts` record (the rows of p_rows in [row_begin, row_end), tokens in [tok_begin, tok_end));
// read_dur: the ns a device spent copying the rankings to the host, or -1 (none copied)
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
                   int64_t             read_dur);

}  // namespace llama_instr
