#include "llama-instr-graph.h"

#include "ggml-backend.h"
#include "llama-context.h"
#include "llama-memory.h"
#include "llama-model.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

namespace llama_instr {

int32_t layer_from_name(const char * name, const char * prefix) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) {
        return -1;
    }
    const char * p = name + n;
    if (*p < '0' || *p > '9') {
        return -1;
    }
    int32_t v = 0;
    while (*p >= '0' && *p <= '9' && v < 1000000) {
        v = v * 10 + (*p - '0');
        p++;
    }
    return v;
}

const ggml_tensor * view_root(const ggml_tensor * t) {
    while (t && t->view_src) {
        t = t->view_src;
    }
    return t;
}

bool is_kv_cache(const ggml_tensor * t) {
    t = view_root(t);
    return t && strncmp(t->name, "cache_", 6) == 0;
}

// SET_ROWS and CPY return a view of their destination: a write into the cache views the cache
bool is_kv_write(const ggml_tensor * t) {
    return (t->op == GGML_OP_SET_ROWS || t->op == GGML_OP_CPY) && is_kv_cache(t);
}

static bool is_weight(const ggml_tensor * t) {
    return t->buffer && ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}

bool is_noop(const ggml_tensor * t) {
    switch (t->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return true;
        default:
            return (t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0;
    }
}

static inline void fnv_mix(uint64_t & h, uint64_t v) {
    h = (h ^ v) * 1099511628211ull;
}

// one node into a fingerprint: its address, op, type, shape and sources (a source freed and another
// made at its address gives the same number: the sources are checked again on a match)
static inline void fingerprint_node(uint64_t & h, const ggml_tensor * t) {
    fnv_mix(h, (uint64_t) (uintptr_t) t);
    fnv_mix(h, ((uint64_t) t->op << 32) | (uint32_t) t->type);
    for (int d = 0; d < GGML_MAX_DIMS; d++) {
        fnv_mix(h, (uint64_t) t->ne[d]);
    }
    for (int k = 0; k < GGML_MAX_SRC && t->src[k]; k++) {
        fnv_mix(h, (uint64_t) (uintptr_t) t->src[k]);
    }
}

uint64_t graph_fingerprint(const ggml_cgraph * g) {
    auto *    gm = const_cast<ggml_cgraph *>(g);
    const int n  = ggml_graph_n_nodes(gm);
    uint64_t  h  = 1469598103934665603ull;
    fnv_mix(h, (uint64_t) n);
    for (int i = 0; i < n; i++) {
        fingerprint_node(h, ggml_graph_node(gm, i));
    }
    return h;
}

// The scheduler's copy of a tensor on another backend is named "<backend>#<name>#<copy>" (see
// ggml_backend_sched_split_graph): the tensor it copies, if that is a node before node i or a
// weight of the model; else the copy itself.
static const ggml_tensor * resolve_copy(const graph_index & gi,
                                        int32_t             i,
                                        const ggml_tensor * src,
                                        const llama_model * model) {
    const char * a = strchr(src->name, '#');
    const char * b = a ? strrchr(a + 1, '#') : nullptr;
    if (!a || !b || b == a + 1 || gi.find(src) >= 0) {
        return src;
    }
    char name[GGML_MAX_NAME];
    snprintf(name, sizeof(name), "%.*s", (int) (b - a - 1), a + 1);
    for (int32_t j = i - 1; j >= 0; j--) {
        if (strcmp(gi.ptrs[j]->name, name) == 0) {
            return gi.ptrs[j];
        }
    }
    const ggml_tensor * w = model ? model->get_tensor(name) : nullptr;
    return w ? w : src;
}

// An encoder's node computed from weights alone (a view or a copy of a weight) is of the node that
// first reads it: ggml adds such a node where the graph's last expansion first reaches it, which is
// inside the last block when clip's build_attn has put that block's Q, K and V in the graph early
// (gemma3's transposed projection matrix, MobileVLM's depthwise kernels), not beside its reader.
// A node the callback named keeps its layer.
static void weights_take_readers_layer(graph_index & gi, int32_t unset) {
    const int32_t        n = (int32_t) gi.ptrs.size();
    std::vector<int32_t> reader(n, -1);
    std::vector<uint8_t> of_weights(n, 0);
    for (int32_t i = 0; i < n; i++) {
        bool w = gi.src(i, 0) != nullptr;
        for (int k = 0; k < GGML_MAX_SRC && gi.src(i, k); k++) {
            const int32_t si = gi.find(gi.src(i, k));
            if (si >= 0) {
                w          = w && of_weights[si];
                reader[si] = reader[si] < 0 ? i : reader[si];
            } else {
                w = w && is_weight(view_root(gi.src(i, k)));
            }
        }
        of_weights[i] = w;
    }
    for (int32_t i = n - 1; i >= 0; i--) {  // (a reader comes after what it reads)
        if (of_weights[i] && gi.il_at[i] == unset && reader[i] >= 0) {
            gi.layer[i] = gi.layer[reader[i]];
        }
    }
}

void encoder_layers(std::vector<std::pair<const ggml_tensor *, int32_t>> & il_of, int32_t n_layer) {
    size_t  begin = 0, end = 0;  // the longest run: il_of[begin, end)
    int32_t most = 0;            // its blocks
    size_t  at   = 0;            // the current run's start
    int32_t last = -1;           // its last block (-1: no run)
    for (size_t k = 0; k < il_of.size(); k++) {
        const int32_t il = il_of[k].second;
        if (il < 0) {
            continue;
        }
        if (last >= 0 && (il == last || il == last + 1)) {
            last = il;
        } else if (il == 0) {
            at   = k;
            last = 0;
        } else {
            last = -1;
            continue;
        }
        // a longer run than any before, or the longest going on
        if (last + 1 > most || (at == begin && last + 1 == most)) {
            most  = last + 1;
            begin = at;
            end   = k + 1;
        }
    }
    if (most == 0) {
        return;
    }
    const int32_t projector = std::max(n_layer, most);
    for (size_t k = 0; k < il_of.size(); k++) {
        int32_t & il = il_of[k].second;
        if (k < begin) {
            il = std::min(il, -1);
        } else if (k >= end || il < 0) {
            il = projector;
        }
    }
}

// a node's layer not found yet, while build() passes over the graph
constexpr int32_t UNSET_LAYER = INT32_MIN;

// Pass 1 of build(), over nodes [0, n): the graph callback's il (-1 = explicitly not in a layer),
// else the layer of a blk.N weight or cache_[kv]_lN source.
static void layers_named(graph_index & gi, int n) {
    for (const auto & [t, il] : gi.il_of) {
        const int32_t i = gi.find(t);
        if (i >= 0) {
            gi.il_at[i] = il;  // a node named twice keeps the later il
        }
    }
    for (int i = 0; i < n; i++) {
        if (gi.il_at[i] != UNSET_LAYER) {
            gi.layer[i] = gi.il_at[i];
            continue;
        }
        for (int k = 0; k < GGML_MAX_SRC && gi.src(i, k); k++) {
            if (gi.find(gi.src(i, k)) >= 0) {
                continue;
            }
            const ggml_tensor * root = view_root(gi.src(i, k));
            int32_t             l    = layer_from_name(root->name, "blk.");
            if (l < 0) {
                l = layer_from_name(root->name, "cache_k_l");
            }
            if (l < 0) {
                l = layer_from_name(root->name, "cache_v_l");
            }
            if (l >= 0) {
                gi.layer[i] = l;
                break;
            }
        }
    }
}

// Passes 2 and 3 of build(), from the last node back: a node still unknown belongs to the block
// whose output the callback names next; an encoder's nodes after the last one named with a
// layer, named by none, are its projector's (tail_layer).
static void layers_named_next(graph_index & gi, int n, int32_t tail_layer) {
    int32_t next_named = UNSET_LAYER;
    bool    tail       = tail_layer != INT32_MIN;  // no node named with a layer after i yet
    for (int i = n - 1; i >= 0; i--) {
        if (gi.il_at[i] != UNSET_LAYER) {
            next_named = gi.il_at[i];
            tail       = tail && gi.il_at[i] < 0;
        } else if (gi.layer[i] == UNSET_LAYER && tail) {
            gi.layer[i] = tail_layer;
        } else if (gi.layer[i] == UNSET_LAYER && next_named != UNSET_LAYER) {
            gi.layer[i] = next_named;
        }
    }
}

// Pass 4 of build(): a node left over takes the latest layer among its node sources (data flows
// forward), or none.
static void layers_from_sources(graph_index & gi, int n) {
    for (int i = 0; i < n; i++) {
        if (gi.layer[i] != UNSET_LAYER) {
            continue;
        }
        int32_t from_nodes = -1;
        for (int k = 0; k < GGML_MAX_SRC && gi.src(i, k); k++) {
            const int32_t si = gi.find(gi.src(i, k));
            if (si >= 0 && si < i) {
                from_nodes = std::max(from_nodes, gi.layer[si]);
            }
        }
        gi.layer[i] = from_nodes;
    }
}

void graph_index::build(const ggml_cgraph * g, const llama_model * model, int32_t tail_layer) {
    auto *    gm = const_cast<ggml_cgraph *>(g);
    const int n  = ggml_graph_n_nodes(gm);
    gf           = nullptr;  // (until it is whole: a build that fails leaves no index behind)
    n_nodes      = 0;
    shape        = graph_fingerprint(g);
    shape_split  = 0;
    ptrs.resize(n);
    srcs.assign((size_t) n * GGML_MAX_SRC, nullptr);
    idx.clear();
    idx.reserve((size_t) n * 2);
    for (int i = 0; i < n; i++) {
        const ggml_tensor * t = ggml_graph_node(gm, i);
        ptrs[i]               = t;
        idx[t]                = i;
        for (int k = 0; k < GGML_MAX_SRC && t->src[k]; k++) {
            srcs[(size_t) i * GGML_MAX_SRC + k] = resolve_copy(*this, i, t->src[k], model);
        }
    }

    // Layer of each node, in passes:
    //  1. the graph callback's il (-1 = explicitly not in a layer), else the layer of a blk.N
    //     weight or cache_[kv]_lN source;
    //  2. nodes still unknown belong to the block whose output the callback names next (the
    //     callback names a block's result; the unnamed nodes before it compute that result);
    //  3. an encoder's nodes after the last one named with a layer, named by none, are its
    //     projector's (tail_layer);
    //  4. left-overs (e.g. the session began after the graph was built, so there were no
    //     callbacks) take the latest layer among their node sources: data flows forward;
    //  5. an encoder's nodes computed from weights alone take their first reader's layer
    //     (weights_take_readers_layer).
    layer.assign(n, UNSET_LAYER);
    il_at.assign(n, UNSET_LAYER);
    layers_named(*this, n);
    layers_named_next(*this, n, tail_layer);
    layers_from_sources(*this, n);
    if (tail_layer != INT32_MIN) {
        weights_take_readers_layer(*this, UNSET_LAYER);
    }
    il_of.clear();
    gf      = g;
    n_nodes = n;
}

bool graph_index::follow_order(const ggml_cgraph * g) {
    auto * gm = const_cast<ggml_cgraph *>(g);
    if (g != gf || ggml_graph_n_nodes(gm) != n_nodes) {
        return false;
    }
    // the fingerprint as split, and whether any node moved, in one pass
    uint64_t h     = 1469598103934665603ull;
    bool     moved = false;
    fnv_mix(h, (uint64_t) n_nodes);
    for (int32_t i = 0; i < n_nodes; i++) {
        const ggml_tensor * t = ggml_graph_node(gm, i);
        fingerprint_node(h, t);
        moved = moved || t != ptrs[i];
    }
    shape_split = h;
    if (!moved) {
        return false;
    }
    std::vector<int32_t> from(n_nodes);
    for (int32_t i = 0; i < n_nodes; i++) {
        from[i] = find(ggml_graph_node(gm, i));
        if (from[i] < 0) {
            return false;  // not a reordering of the nodes indexed
        }
    }
    std::vector<const ggml_tensor *> p(n_nodes), s((size_t) n_nodes * GGML_MAX_SRC);
    std::vector<int32_t>             l(n_nodes);
    for (int32_t i = 0; i < n_nodes; i++) {
        p[i] = ptrs[from[i]];
        l[i] = layer[from[i]];
        std::copy_n(srcs.begin() + (size_t) from[i] * GGML_MAX_SRC, GGML_MAX_SRC,
                    s.begin() + (size_t) i * GGML_MAX_SRC);
        idx[p[i]] = i;
    }
    ptrs.swap(p);
    layer.swap(l);
    srcs.swap(s);
    shape = shape_split;  // (built again, it is built in this order)
    return true;
}

bool graph_index::same_as(const ggml_cgraph * g, uint64_t shape_of_g) const {
    return g == gf && ggml_graph_n_nodes(const_cast<ggml_cgraph *>(g)) == n_nodes &&
           (shape_of_g == shape || (shape_split != 0 && shape_of_g == shape_split));
}

void graph_index::take_sources(const ggml_cgraph * g) {
    auto * gm = const_cast<ggml_cgraph *>(g);
    for (int32_t i = 0; i < n_nodes; i++) {
        const ggml_tensor * t = ggml_graph_node(gm, i);
        for (int k = 0; k < GGML_MAX_SRC; k++) {
            srcs[(size_t) i * GGML_MAX_SRC + k] = t->src[k];
        }
    }
}

void copy_name(char (&dst)[GGML_MAX_NAME], const char * src) {
    const size_t n = strnlen(src, GGML_MAX_NAME - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// FNV-1a over what a node table's record says, field by field (a name up to its end: the bytes
// after it are a reused buffer's): all of it (h), and all but the numbers of shapes and bytes (s)
struct table_hash {
    uint64_t h = 1469598103934665603ull;
    uint64_t s = 1469598103934665603ull;

    void mix(uint64_t v) {
        h = (h ^ v) * 1099511628211ull;
        s = (s ^ v) * 1099511628211ull;
    }

    void number(uint64_t v) { h = (h ^ v) * 1099511628211ull; }

    void name(const char * str) {
        for (; *str; str++) {
            mix((unsigned char) *str);
        }
        mix(0);
    }

    void dims(const int64_t * ne, int32_t n_dims, int64_t nbytes) {
        mix((uint64_t) n_dims);
        for (int d = 0; d < GGML_MAX_DIMS; d++) {
            number((uint64_t) ne[d]);
        }
        number((uint64_t) nbytes);
    }
};

void graph_table::capture(const graph_index & gi) {
    nodes.resize(gi.n_nodes);
    srcs.clear();
    for (int i = 0; i < gi.n_nodes; i++) {
        const ggml_tensor * t_node = gi.ptrs[i];
        node_snapshot &     ns     = nodes[i];
        copy_name(ns.name, t_node->name);
        ns.op     = t_node->op;
        ns.sub    = t_node->op == GGML_OP_UNARY ? (int32_t) ggml_get_unary_op(t_node) :
                    t_node->op == GGML_OP_GLU   ? (int32_t) ggml_get_glu_op(t_node) :
                                                  -1;
        ns.layer  = gi.layer[i];
        ns.type   = t_node->type;
        ns.n_dims = ggml_n_dims(t_node);
        std::copy(t_node->ne, t_node->ne + GGML_MAX_DIMS, ns.ne);
        ns.nbytes = (int64_t) ggml_nbytes(t_node);

        uint8_t    flags = 0;
        const bool noop  = is_noop(t_node);
        const bool kvw   = is_kv_write(t_node);
        flags |= noop ? NODE_NOOP : 0;
        flags |= kvw ? NODE_KV_WRITE : 0;
        flags |= (t_node->flags & GGML_TENSOR_FLAG_OUTPUT) ? NODE_OUTPUT : 0;

        ns.src_begin = (int32_t) srcs.size();
        for (int k = 0; k < GGML_MAX_SRC && gi.src(i, k); k++) {
            const ggml_tensor * src = gi.src(i, k);
            if (!noop && !kvw && is_kv_cache(src)) {
                flags |= NODE_KV_READ;
            }
            srcs.emplace_back();
            src_snapshot & ss = srcs.back();
            ss.node           = gi.find(src);
            if (ss.node >= 0) {
                ss.kind = SRC_NODE;
                continue;
            }
            copy_name(ss.name, src->name);
            ss.kind   = is_kv_cache(src)                      ? SRC_KV_CACHE :
                        is_weight(view_root(src))             ? SRC_WEIGHT :
                        (src->flags & GGML_TENSOR_FLAG_INPUT) ? SRC_INPUT :
                                                                SRC_OTHER;
            ss.type   = src->type;
            ss.n_dims = ggml_n_dims(src);
            std::copy(src->ne, src->ne + GGML_MAX_DIMS, ss.ne);
            ss.nbytes = (int64_t) ggml_nbytes(src);
        }
        ns.n_src = (int32_t) srcs.size() - ns.src_begin;
        ns.flags = flags;
    }
    table_hash th;
    th.mix(nodes.size());
    for (const node_snapshot & ns : nodes) {
        th.name(ns.name);
        th.mix(((uint64_t) (uint32_t) ns.op << 32) | (uint32_t) ns.sub);
        th.mix(((uint64_t) (uint32_t) ns.layer << 32) | (uint32_t) ns.type);
        th.dims(ns.ne, ns.n_dims, ns.nbytes);
        th.mix(((uint64_t) ns.flags << 32) | (uint32_t) ns.n_src);
        for (int32_t k = 0; k < ns.n_src; k++) {
            const src_snapshot & ss = srcs[ns.src_begin + k];
            th.mix(((uint64_t) (uint32_t) ss.node << 32) | (uint32_t) ss.kind);
            if (ss.kind != SRC_NODE) {
                th.name(ss.name);
                th.mix((uint64_t) ss.type);
                th.dims(ss.ne, ss.n_dims, ss.nbytes);
            }
        }
    }
    structure = th.h;
    skeleton  = th.s;
}

// a shape's numbers as json_out::shape writes them (at least one), then the bytes
static void push_numbers(std::vector<int64_t> & out,
                         std::vector<uint8_t> & where,
                         const int64_t *        ne,
                         int32_t                n_dims,
                         int64_t                nbytes) {
    for (int d = 0; d < std::max(1, n_dims); d++) {
        out.push_back(ne[d]);
        where.push_back((uint8_t) d);
    }
    out.push_back(nbytes);
    where.push_back(SUBST_BYTES);
}

void graph_table::numbers(std::vector<int64_t> & out, std::vector<uint8_t> & where) const {
    out.clear();
    where.clear();
    for (const node_snapshot & ns : nodes) {
        push_numbers(out, where, ns.ne, ns.n_dims, ns.nbytes);
        for (int32_t k = 0; k < ns.n_src; k++) {
            const src_snapshot & ss = srcs[ns.src_begin + k];
            if (ss.kind != SRC_NODE) {
                push_numbers(out, where, ss.ne, ss.n_dims, ss.nbytes);
            }
        }
    }
}

static const char * src_kind_name(src_kind k) {
    switch (k) {
        case SRC_WEIGHT:
            return "weight";
        case SRC_KV_CACHE:
            return "kv_cache";
        case SRC_INPUT:
            return "input";
        default:
            return "other";
    }
}

// the head every `graph` record begins with: its context, id and tokens
static void write_graph_head(json_out & j, const graph_head & h, const std::string & sid, int32_t ctx_id) {
    record_head(j, "graph", h.ts, sid);
    j.key("ctx");
    j.i64(ctx_id);
    j.key("graph");
    j.i64(h.graph_id);
    j.key("n_tokens");
    j.i64(h.n_tokens);
}

void graph_table::write_same(json_out &          j,
                             const graph_head &  h,
                             const std::string & sid,
                             int32_t             ctx_id,
                             int32_t             same_as,
                             bool                substituted,
                             const int64_t *     subst,
                             size_t              n_subst,
                             const int64_t *     at,
                             size_t              n_at) const {
    write_graph_head(j, h, sid, ctx_id);
    j.key("same_as");
    j.i64(same_as);
    if (substituted) {
        j.key("subst");
        j.ch('[');
        for (size_t i = 0; i < n_subst; i++) {
            j.sep();
            j.ch('[');
            j.i64s({ subst[3 * i], subst[3 * i + 1], subst[3 * i + 2] });
            j.ch(']');
        }
        j.ch(']');
    }
    if (n_at > 0) {
        j.key("subst_at");
        j.ch('[');
        for (size_t i = 0; i < n_at; i++) {
            j.sep();
            j.ch('[');
            j.i64s({ at[2 * i], at[2 * i + 1] });
            j.ch(']');
        }
        j.ch(']');
    }
    j.ch('}');
}

// a node's source: a node of the same graph by its index, else the tensor it reads
static void write_src(json_out & j, const src_snapshot & ss) {
    if (ss.kind == SRC_NODE) {
        j.raw("{\"node\":");
        j.i64(ss.node);
        j.ch('}');
        return;
    }
    j.ch('{');
    j.key("name");
    j.str(ss.name);
    j.key("kind");
    j.str(src_kind_name(ss.kind));
    j.key("type");
    j.str(ggml_type_name((ggml_type) ss.type));
    j.key("shape");
    j.shape(ss.ne, ss.n_dims);
    j.key("bytes");
    j.i64(ss.nbytes);
    j.ch('}');
}

// a node's flags, by name
static void write_flags(json_out & j, uint8_t flags) {
    static const struct {
        node_flag    flag;
        const char * name;
    } names[] = {
        { NODE_NOOP,     "\"noop\""     },
        { NODE_KV_WRITE, "\"kv_write\"" },
        { NODE_KV_READ,  "\"kv_read\""  },
        { NODE_OUTPUT,   "\"output\""   },
    };

    j.ch('[');
    for (const auto & f : names) {
        if (flags & f.flag) {
            j.sep();
            j.raw(f.name);
        }
    }
    j.ch(']');
}

// node i of the table, its sources srcs[0, ns.n_src)
static void write_node(json_out & j, size_t i, const node_snapshot & ns, const src_snapshot * srcs) {
    j.ch('{');
    j.key("i");
    j.i64((int64_t) i);
    j.key("name");
    j.str(ns.name);
    j.key("op");
    j.str(ggml_op_name((ggml_op) ns.op));
    j.key("sub");
    if (ns.op == GGML_OP_UNARY) {
        j.str(ggml_unary_op_name((ggml_unary_op) ns.sub));
    } else if (ns.op == GGML_OP_GLU) {
        j.str(ggml_glu_op_name((ggml_glu_op) ns.sub));
    } else {
        j.null();
    }
    j.key("layer");
    if (ns.layer >= 0) {
        j.i64(ns.layer);
    } else {
        j.null();
    }
    j.key("shape");
    j.shape(ns.ne, ns.n_dims);
    j.key("dtype");
    j.str(ggml_type_name((ggml_type) ns.type));
    j.key("bytes");
    j.i64(ns.nbytes);
    j.key("src");
    j.ch('[');
    for (int32_t k = 0; k < ns.n_src; k++) {
        j.sep();
        write_src(j, srcs[k]);
    }
    j.ch(']');
    j.key("flags");
    write_flags(j, ns.flags);
    j.ch('}');
}

void graph_table::write(json_out & j, const graph_head & h, const std::string & sid, int32_t ctx_id) const {
    write_graph_head(j, h, sid, ctx_id);
    j.key("nodes");
    j.ch('[');
    for (size_t i = 0; i < nodes.size(); i++) {
        j.sep();
        write_node(j, i, nodes[i], srcs.data() + nodes[i].src_begin);
    }
    j.ch(']');
    j.ch('}');
}

void table_memory::clear() {
    written.clear();
    bases.clear();
}

bool table_memory::substitution(const base & b) {
    if (b.numbers.size() != nums.size()) {
        return false;
    }
    // 1. the values that change somewhere, each in its place (a dimension, or bytes)
    map.clear();
    for (size_t i = 0; i < nums.size(); i++) {
        if (b.numbers[i] != nums[i]) {
            map.emplace(place{ b.numbers[i], where[i] }, 0);
            if (map.size() > SUBST_MAX + AT_MAX) {
                return false;
            }
        }
    }
    // 2. each becomes what it becomes most often where it is (staying itself included: a value
    // that means two things, such as a batch of 2 tokens and 2 heads, mostly keeps one of them)
    votes.clear();
    for (size_t i = 0; i < nums.size(); i++) {
        if (map.count(place{ b.numbers[i], where[i] })) {
            votes.push_back(vote{ where[i], b.numbers[i], nums[i] });
        }
    }
    std::sort(votes.begin(), votes.end());
    subst.clear();
    for (size_t i = 0; i < votes.size();) {
        size_t  best_n = 0;
        int64_t best   = votes[i].from;
        size_t  k      = i;
        while (k < votes.size() && votes[k].where == votes[i].where && votes[k].from == votes[i].from) {
            size_t n = k;
            while (n < votes.size() && votes[n].where == votes[k].where && votes[n].from == votes[k].from &&
                   votes[n].to == votes[k].to) {
                n++;
            }
            if (n - k > best_n) {
                best_n = n - k;
                best   = votes[k].to;
            }
            k = n;
        }
        const place key{ votes[i].from, votes[i].where };
        if (best == votes[i].from) {
            map.erase(key);
        } else {
            map[key] = best;
            if (subst.size() / 3 >= SUBST_MAX) {
                return false;
            }
            subst.push_back(votes[i].where);
            subst.push_back(votes[i].from);
            subst.push_back(best);
        }
        i = k;
    }
    // 3. the map applied to every number of the base: where it does not give this table's, the
    // number is written by its position
    at.clear();
    for (size_t i = 0; i < nums.size(); i++) {
        auto it = map.find(place{ b.numbers[i], where[i] });
        if ((it == map.end() ? b.numbers[i] : it->second) != nums[i]) {
            if (at.size() / 2 >= AT_MAX) {
                return false;
            }
            at.push_back((int64_t) i);
            at.push_back(nums[i]);
        }
    }
    return true;
}

void table_memory::write(const graph_table & t,
                         const graph_head &  h,
                         json_out &          j,
                         const std::string & sid,
                         int32_t             ctx_id) {
    auto same = written.find(t.structure);
    if (same != written.end()) {
        t.write_same(j, h, sid, ctx_id, same->second);
        return;
    }
    if (written.size() >= TABLES_MAX) {
        clear();  // a reader keeps as many tables per context: the bases too are written again
    }
    clock++;
    t.numbers(nums, where);
    // of the bases of the same skeleton, the one that gives the shortest substitution
    base * best     = nullptr;
    size_t best_len = 0;
    for (base & b : bases) {
        if (b.skeleton != t.skeleton || !substitution(b)) {
            continue;
        }
        const size_t len = subst.size() + at.size();
        if (!best || len < best_len) {
            best     = &b;
            best_len = len;
            best_subst.swap(subst);
            best_at.swap(at);
        }
    }
    if (best) {
        best->used = clock;
        t.write_same(j, h, sid, ctx_id, best->graph_id, true, best_subst.data(), best_subst.size() / 3, best_at.data(),
                     best_at.size() / 2);
        written.emplace(t.structure, h.graph_id);
        return;
    }
    t.write(j, h, sid, ctx_id);
    written.emplace(t.structure, h.graph_id);
    base * slot = nullptr;
    if (bases.size() < BASES_MAX) {
        bases.emplace_back();
        slot = &bases.back();
    } else {
        slot = &*std::min_element(bases.begin(), bases.end(),
                                  [](const base & a, const base & b) { return a.used < b.used; });
    }
    slot->skeleton = t.skeleton;
    slot->graph_id = h.graph_id;
    slot->used     = clock;
    slot->numbers.swap(nums);
}

std::string reserved_graph_json(llama_context * ctx, int32_t n_tokens, int32_t n_outputs) {
    // llama_graph_reserve, but split only: it would also allocate the compute buffers, and with
    // the weights not loaded ggml's allocator would take their tensors for its own to place
    llama_memory_context_ptr mctx;
    if (llama_memory_t mem = ctx->get_memory()) {
        mctx = mem->init_full();
    }
    ggml_cgraph * gf = ctx->graph_reserve((uint32_t) n_tokens, 1, (uint32_t) n_outputs, mctx.get(), true);
    if (!gf) {
        return {};
    }
    ggml_backend_sched_t sched = ctx->get_sched();

    graph_index gi;
    gi.build(gf, &ctx->get_model());
    graph_table table;
    table.capture(gi);

    std::string line;
    json_out    j{ line };
    graph_head  head;
    head.n_tokens = n_tokens;
    table.write(j, head, "", -1);
    line.pop_back();  // the record's closing brace: "devices" goes inside it
    j.key("devices");
    j.ch('[');
    for (int32_t i = 0; i < gi.n_nodes; i++) {
        ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, const_cast<ggml_tensor *>(gi.ptrs[i]));
        j.sep();
        if (b) {
            j.str(ggml_backend_dev_name(ggml_backend_get_device(b)));
        } else {
            j.null();
        }
    }
    j.ch(']');
    j.ch('}');
    ggml_backend_sched_reset(sched);
    return line;
}

}  // namespace llama_instr
