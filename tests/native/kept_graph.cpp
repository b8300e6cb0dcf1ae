// A kept graph's identity (issue 55 §1): llama.cpp builds its graphs again in memory it keeps, so a
// graph built again at the same addresses, with the same ops and shapes, may read other sources
// (a control vector's, a LoRA adapter's, the scheduler's copies): one built under another
// scheduler, whose sources were freed since. graph_index::same_as must tell it from the graph
// indexed; and a graph built again the same must still be found, its sources read again.
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "ggml.h"
#include "llama-instr-graph.h"

#include <cstdio>
#include <vector>

// y = (x + s) * 2, built in `mem` as llama.cpp builds a graph in its buf_compute_meta
static ggml_cgraph * build(std::vector<char> & mem, ggml_context *& ctx, ggml_tensor * s) {
    if (ctx) {
        ggml_free(ctx);
    }
    ggml_init_params p = { mem.size(), mem.data(), true };
    ctx                = ggml_init(p);
    ggml_tensor * x    = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8);
    ggml_tensor * y    = ggml_scale(ctx, ggml_add(ctx, x, s), 2.0f);
    ggml_cgraph * gf   = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    return gf;
}

// a source of its own context, in memory of its own
static ggml_tensor * source(std::vector<char> & mem) {
    ggml_init_params p = { mem.size(), mem.data(), true };
    return ggml_new_tensor_1d(ggml_init(p), GGML_TYPE_F32, 8);
}

int main() {
    std::vector<char> mem(1 << 20), mem_a(1 << 16), mem_b(1 << 16);
    ggml_tensor *     a   = source(mem_a);
    ggml_tensor *     b   = source(mem_b);
    ggml_context *    ctx = nullptr;

    llama_instr::graph_index gi;
    ggml_cgraph *            g1 = build(mem, ctx, a);
    gi.build(g1);
    CHECK(gi.n_nodes == 2);

    // the same nodes at the same addresses, reading b instead of a: another graph
    ggml_cgraph * g2 = build(mem, ctx, b);
    CHECK(g2 == g1 && ggml_graph_node(g2, 0) == gi.ptrs[0]);
    CHECK(!gi.same_as(g2, llama_instr::graph_fingerprint(g2)));

    // built again reading a: the graph indexed, and its sources are g3's own
    ggml_cgraph * g3 = build(mem, ctx, a);
    CHECK(gi.same_as(g3, llama_instr::graph_fingerprint(g3)));
    gi.take_sources(g3);
    for (int i = 0; i < gi.n_nodes; i++) {
        for (int k = 0; k < GGML_MAX_SRC; k++) {
            CHECK(gi.src(i, k) == ggml_graph_node(g3, i)->src[k]);
        }
    }
    printf("ok\n");
    return 0;
}
