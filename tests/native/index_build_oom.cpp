// An index whose build fails part way (issue 55 §1): graph_index::build with every allocation from
// the n-th on failing, for n = 1, 2, ... until one runs through, rebuilding a graph indexed whole
// before. Each failure must leave no index that same_as takes for the graph: compute_begin would
// then skip indexing it again, and time and name its nodes from half-filled tables. Before the fix
// build() set gf, n_nodes and the fingerprint first, so a failed build left an index that matched.
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "fail_from.h"
#include "ggml.h"
#include "llama-instr-graph.h"

#include <cstdio>
#include <new>
#include <vector>

int main() {
    // a chain of 64 ops, so that the index's tables are large enough to allocate each on its own
    std::vector<char> mem(1 << 22);
    ggml_init_params  p   = { mem.size(), mem.data(), true };
    ggml_context *    ctx = ggml_init(p);
    ggml_tensor *     y   = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8);
    for (int i = 0; i < 64; i++) {
        y = ggml_scale(ctx, ggml_add(ctx, y, y), 0.5f);
    }
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    const uint64_t shape = llama_instr::graph_fingerprint(g);

    // built as an encoder's graph (a layer for the nodes after its blocks), so that the passes only
    // an encoder's index takes allocate under the failures too
    const int32_t tail_layer = 1;
    int           failures   = 0;
    for (long from = 1;; from++) {
        llama_instr::graph_index gi;
        gi.build(g, nullptr, tail_layer);
        CHECK(gi.same_as(g, shape));
        gi.il_of.emplace_back(ggml_graph_node(g, 3), 0);  // as the graph callback leaves them
        fail_allocations_from(from);
        bool failed = false;
        try {
            gi.build(g, nullptr, tail_layer);
        } catch (const std::bad_alloc &) {
            failed = true;
        }
        fail_allocations_from(0);
        if (!failed) {
            CHECK(gi.same_as(g, shape) && gi.n_nodes == ggml_graph_n_nodes(g));
            break;
        }
        failures++;
        CHECK(!gi.same_as(g, shape));
        CHECK(gi.gf == nullptr);
    }
    CHECK(failures >= 3);
    printf("%d failed builds, none left an index\n", failures);
    ggml_free(ctx);
    return 0;
}
