#pragma once

// llamacpp-instr: the compute graph's node table. A graph is indexed when it is built (which node
// is which, and its layer), captured as plain data inside the step, and formatted as a `graph`
// record only after the step's end time is taken.

#include "ggml.h"
#include "llama-instr-json.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct llama_context;
struct llama_model;

namespace llama_instr {

enum node_flag : uint8_t {
    NODE_NOOP     = 1,
    NODE_KV_WRITE = 2,
    NODE_KV_READ  = 4,
    NODE_OUTPUT   = 8,
};

// where a number of a `subst` is: 0 to 3, that dimension of a shape; this, the bytes
constexpr uint8_t SUBST_BYTES = 4;

enum src_kind : uint8_t {
    SRC_NODE,
    SRC_WEIGHT,
    SRC_KV_CACHE,
    SRC_INPUT,
    SRC_OTHER,
};

// Which node is which in a context's current graph, the layer of each, and each node's sources
// as the model built them.
struct graph_index {
    const ggml_cgraph *                              gf          = nullptr;
    int32_t                                          n_nodes     = 0;
    uint64_t                                         shape       = 0;  // fingerprint(gf) when indexed
    uint64_t                                         shape_split = 0;  // ... once the scheduler split it (0: not seen)
    std::vector<const ggml_tensor *>                 ptrs;             // index -> node
    std::vector<int32_t>                             layer;            // index -> layer, or -1
    std::vector<const ggml_tensor *>                 srcs;             // index * GGML_MAX_SRC + k -> source k
    std::unordered_map<const ggml_tensor *, int32_t> idx;              // node -> index

    // layer ids the graph callback gave while the graph was being built, in the order given
    // (cleared by build()): appended, so that the callback allocates nothing once warm
    std::vector<std::pair<const ggml_tensor *, int32_t>> il_of;
    std::vector<int32_t>                                 il_at;  // build()'s: index -> the callback's il

    // Index gf. Built before the backend scheduler allocates the graph, the sources are the
    // model's own tensors; the scheduler then replaces a source that lives on another backend with
    // its copy ("CUDA0#name#0"). Built after that (the session began after the graph was built),
    // such a copy is resolved back by name: to the node it copies, or to the model's weight.
    // `tail_layer`: the layer of the nodes after the last one the callback named with a layer that
    // no callback named (an encoder's projector, which clip builds after its blocks without naming
    // all of it); INT32_MIN: none, they take their sources' latest layer.
    void build(const ggml_cgraph * gf, const llama_model * model = nullptr, int32_t tail_layer = INT32_MIN);

    // Is gf, whose fingerprint is `shape_of_gf`, the graph indexed here (built again the same)?
    // llama.cpp rebuilds a graph in the same memory, so equal graph and node addresses prove
    // nothing: the nodes' ops, types, shapes and sources must match too (as built, or as the
    // scheduler split it: it reads some sources through copies of its own).
    bool same_as(const ggml_cgraph * gf, uint64_t shape_of_gf) const;

    // gf, the graph indexed here built again the same (same_as, before the scheduler split it): its
    // sources read again from gf, so that the index holds no tensor of an earlier build.
    void take_sources(const ggml_cgraph * gf);

    // gf, indexed before ggml's scheduler split it, now split: its fingerprint as split is noted
    // (shape_split), and if a backend's graph_optimize reordered its nodes (the Vulkan backend
    // groups independent nodes), the same nodes, with their layers and sources, are renumbered in
    // their new order, the order they run in. True if they were (false if nothing moved, or gf is
    // not a reordering of the graph indexed).
    bool follow_order(const ggml_cgraph * gf);

    // the source k of node i as indexed (nullptr past the last)
    const ggml_tensor * src(int32_t i, int k) const { return srcs[(size_t) i * GGML_MAX_SRC + k]; }

    int32_t find(const ggml_tensor * t) const {
        auto it = idx.find(t);
        return it == idx.end() ? -1 : it->second;
    }
};

struct src_snapshot {
    char     name[GGML_MAX_NAME];
    int32_t  node;  // index of a node of the same graph, or -1
    src_kind kind;
    int32_t  type;
    int32_t  n_dims;
    int64_t  ne[GGML_MAX_DIMS];
    int64_t  nbytes;
};

struct node_snapshot {
    char    name[GGML_MAX_NAME];
    int32_t op;
    int32_t sub;  // unary or GLU op, or -1
    int32_t layer;
    int32_t type;
    int32_t n_dims;
    int64_t ne[GGML_MAX_DIMS];
    int64_t nbytes;
    uint8_t flags;  // node_flag
    int32_t src_begin;
    int32_t n_src;
};

// The nodes, ops, types, shapes and sources of a graph folded into one number (FNV-1a): equal for a
// graph built again the same in the same memory, reading the same tensors.
uint64_t graph_fingerprint(const ggml_cgraph * gf);

// An encoder's layers from what clip's callback named while it built the graph (`il_of`, in
// order), rewritten in place. Its blocks are the longest run of named layers that starts at 0 and
// steps by 0 or 1 (clip's loop over its blocks); a layer named before the run is the input's (-1:
// a pre-encoder numbering its convolutions); every name after the run, numbered or not, and a
// name with no layer within it (a merger between blocks) are the projector's: layer
// max(n_layer, the run's last + 1) (a projector numbering its own modules from 0 is taken for a
// block only after an encoder of one block). Without a run (no block named), nothing changes.
void encoder_layers(std::vector<std::pair<const ggml_tensor *, int32_t>> & il_of, int32_t n_layer);

// What a `graph` record says besides the node table: which graph of the session it is, for how
// many tokens, and when its table was taken.
struct graph_head {
    int32_t graph_id = 0;
    int32_t n_tokens = 0;
    int64_t ts       = 0;
};

// A graph's node table as plain data: the same for every build of the same graph, so captured
// once per graph kept (ctx_state::graphs_kept).
struct graph_table {
    uint64_t                   structure = 0;  // every field the record writes of nodes and sources, hashed
    uint64_t                   skeleton  = 0;  // the same, less the numbers of shapes and bytes
    std::vector<node_snapshot> nodes;
    std::vector<src_snapshot>  srcs;

    void capture(const graph_index & gi);

    // the `graph` record (one line, without the newline)
    void write(json_out & j, const graph_head & h, const std::string & sid, int32_t ctx_id) const;

    // the `graph` record of a graph whose node table is graph `same_as`'s, written before in the
    // same file: its id and tokens, and that id instead of the nodes; with `subst` (n_subst
    // triples: where, old value, new value) and `subst_at` (n_at pairs: position, value), the
    // numbers of shapes and bytes of that table so replaced
    void write_same(json_out &          j,
                    const graph_head &  h,
                    const std::string & sid,
                    int32_t             ctx_id,
                    int32_t             same_as,
                    bool                substituted = false,
                    const int64_t *     subst       = nullptr,
                    size_t              n_subst     = 0,
                    const int64_t *     at          = nullptr,
                    size_t              n_at        = 0) const;

    // every number of shapes and bytes the record writes (a node's shape and bytes, then its
    // leaf sources'), in the order it writes them, and where each is: its dimension in a shape
    // (0 to 3), or SUBST_BYTES
    void numbers(std::vector<int64_t> & out, std::vector<uint8_t> & where) const;
};

// The node tables a context wrote in the current file, for a later graph to name instead of
// writing its own whole: one equal to a table written (whole or by `subst`) names it
// (`same_as`); one that differs from a table written whole only in the numbers of shapes and
// bytes names it with the substitution that gives its own (`same_as` and `subst`: per dimension
// of a shape, and for bytes, which values become which). Its memory
// is bounded: TABLES_MAX structures per file (past it, it starts over), and the numbers of
// BASES_MAX tables written whole (the most recently used).
class table_memory {
  public:
    static constexpr size_t TABLES_MAX = 4096;
    static constexpr size_t BASES_MAX  = 16;
    static constexpr size_t SUBST_MAX  = 256;   // triples of a `subst` (past it, written whole)
    static constexpr size_t AT_MAX     = 1024;  // pairs of a `subst_at` (past it, written whole)

    void clear();

    // the `graph` record of t (one line, without the newline): whole, or naming a table written
    void write(const graph_table & t, const graph_head & h, json_out & j, const std::string & sid, int32_t ctx_id);

  private:
    struct base {
        uint64_t             skeleton = 0;
        int32_t              graph_id = 0;
        uint64_t             used     = 0;  // when it was last named (a tick of `clock`)
        std::vector<int64_t> numbers;
    };

    // the substitution that turns b's numbers into `nums` (triples into `subst`, the numbers it
    // does not give into `at`), if there is one within SUBST_MAX and AT_MAX
    bool substitution(const base & b);

    // a number and where it is (graph_table::numbers), as one key of `map`
    struct place {
        int64_t value;
        uint8_t where;

        bool operator==(const place & o) const { return value == o.value && where == o.where; }
    };

    struct place_hash {
        size_t operator()(const place & p) const { return std::hash<int64_t>()(p.value) * 31 + p.where; }
    };

    std::unordered_map<uint64_t, int32_t> written;  // structure -> graph id whose record holds it
    std::vector<base>                     bases;
    uint64_t                              clock = 0;

    // scratch, kept from graph to graph
    std::vector<int64_t>                           nums;
    std::vector<uint8_t>                           where;
    std::vector<int64_t>                           subst;
    std::vector<int64_t>                           at;
    std::vector<int64_t>                           best_subst;
    std::vector<int64_t>                           best_at;
    std::unordered_map<place, int64_t, place_hash> map;

    struct vote {
        uint8_t where;
        int64_t from;
        int64_t to;

        bool operator<(const vote & o) const {
            return where != o.where ? where < o.where : from != o.from ? from < o.from : to < o.to;
        }
    };

    std::vector<vote> votes;
};

// The node table of the graph llama.cpp builds for a ubatch of n_tokens tokens with n_outputs
// outputs, its KV cache at full size (as llama.cpp reserves its worst case), split by ggml's
// scheduler and never computed, so that a model loaded without its weights (no_alloc) gives it:
// a `graph` record (graph id 0, no session) with one more field, "devices": per node, the name of
// the ggml device the scheduler put it on. What `instr predict` costs a setting not run by.
std::string reserved_graph_json(llama_context * ctx, int32_t n_tokens, int32_t n_outputs);

// helpers shared with the value statistics and the timing
const ggml_tensor * view_root(const ggml_tensor * t);
bool                is_kv_cache(const ggml_tensor * t);
bool                is_kv_write(const ggml_tensor * t);
bool                is_noop(const ggml_tensor * t);  // a view or reshape that does no work, or not computed

// N of a name "<prefix>N..." (blk.N.attn_q.weight, cache_k_lN), or -1
int32_t layer_from_name(const char * name, const char * prefix);

// a tensor's name into a name buffer (truncated, always terminated): a bounded copy, not
// snprintf, which costs several times more and runs for every node of each graph captured
void copy_name(char (&dst)[GGML_MAX_NAME], const char * src);

}  // namespace llama_instr
