// The walk of a GPU's timing marks (llama-instr-gpu-marks.h), driven with marks made up here in
// the shapes ggml-cuda writes them (patch 0013): a graph compute's ops on the main stream, one on
// a side stream joined back, copies on the thread's stream, a mark that never ran, a mark of no
// node of the graph. Every expected interval is computed here from the marks' times.
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "ggml-cuda-instr.h"
#include "llama-instr-gpu-marks.h"

#include <cstdio>
#include <vector>

using namespace llama_instr;

// nodes are the addresses of `fake[i]`; node i is of layer layers[i]; one split covers them all
struct lookup final : gpu_node_lookup {
    std::vector<ggml_tensor> fake = std::vector<ggml_tensor>(8);
    std::vector<int32_t>     layers{ 0, 0, 1, 1, 1, 2, -1, -1 };
    std::vector<int32_t>     asked;  // the marks k the walk asked about, in order

    gpu_node find(int32_t k, const ggml_tensor * node) override {
        asked.push_back(k);
        for (size_t i = 0; i < fake.size(); i++) {
            if (node == &fake[i]) {
                return { (int32_t) i, layers[i], 0 };
            }
        }
        return { -1, -1, -1 };
    }
};

static ggml_cuda_profile_mark op(const ggml_tensor * node, uint64_t t, int32_t stream = 0, int32_t n_ops = 1,
                                 int32_t n_fused = 0, int32_t graph = 0) {
    ggml_cuda_profile_mark m = {};
    m.node                   = node;
    m.kind                   = GGML_CUDA_PROFILE_OP;
    m.n_fused                = n_fused;
    m.n_ops                  = n_ops;
    m.stream                 = stream;
    m.graph                  = graph;
    m.valid                  = 1;
    m.t                      = t;
    return m;
}

static ggml_cuda_profile_mark mark(int32_t kind, uint64_t t, int32_t stream = 0, const ggml_tensor * node = nullptr,
                                   int64_t bytes = 0, int32_t graph = 0) {
    ggml_cuda_profile_mark m = {};
    m.node                   = node;
    m.bytes                  = bytes;
    m.kind                   = kind;
    m.stream                 = stream;
    m.graph                  = graph;
    m.valid                  = 1;
    m.t                      = t;
    return m;
}

static void detailed() {
    lookup                              nodes;
    const int64_t                       off = 1000000;  // host = device + off
    std::vector<ggml_cuda_profile_mark> m   = {
        // a copy into the device on the thread's stream, before the graph compute
        mark(GGML_CUDA_PROFILE_COPY_BEGIN, 100, GGML_CUDA_PROFILE_THREAD_STREAM, &nodes.fake[0], 4096, -1),
        mark(GGML_CUDA_PROFILE_COPY_END, 140, GGML_CUDA_PROFILE_THREAD_STREAM, &nodes.fake[0], 4096, -1),
        op(&nodes.fake[0], 200),
        op(&nodes.fake[1], 230, 0, 1, 1),  // fuses node 2
        op(&nodes.fake[3], 260, 1),        // on side stream 1
        op(&nodes.fake[4], 300),
        mark(GGML_CUDA_PROFILE_JOIN, 330, 1),
        op(&nodes.fake[5], 340),
        mark(GGML_CUDA_PROFILE_GRAPH_END, 400),
    };
    std::vector<op_rec>    ops;
    std::vector<layer_rec> layers;
    std::vector<busy_rec>  busy;
    std::vector<gpu_copy>  copies;
    gpu_walk_out           out{ ops, layers, busy, copies };
    const int64_t          lost = walk_gpu_marks(m.data(), (int32_t) m.size(), off, 7, true, nodes, out);
    CHECK(lost == 0);
    // ops in the order their intervals closed; each ends at the next mark on its stream
    CHECK(ops.size() == 5);
    struct want {
        int32_t idx, layer, n_fused;
        int64_t a, b;
    } expect[] = {
        { 0, 0, 0, 200, 230 },
        { 1, 0, 1, 230, 300 },  // node 3 runs on stream 1: node 1's interval ends at node 4's mark
        { 3, 1, 0, 260, 330 },  // ended by the join
        { 4, 1, 0, 300, 340 },
        { 5, 2, 0, 340, 400 },
    };
    for (size_t i = 0; i < ops.size(); i++) {
        CHECK(ops[i].idx == expect[i].idx);
        CHECK(ops[i].layer == expect[i].layer);
        CHECK(ops[i].n_fused == expect[i].n_fused);
        CHECK(ops[i].device == 7);
        CHECK(ops[i].t_start == expect[i].a + off && ops[i].t_end == expect[i].b + off);
        CHECK(ops[i].thread_begin == -1);
    }
    CHECK(layers.empty());  // (DETAILED: the timer makes them from the ops)
    CHECK(busy.size() == 1);
    CHECK(busy[0].device == 7 && busy[0].split == 0 && busy[0].n_ops == 5);
    CHECK(busy[0].t_start == 200 + off && busy[0].t_end == 400 + off);
    CHECK(copies.size() == 1);
    CHECK(copies[0].tensor == &nodes.fake[0] && copies[0].bytes == 4096);
    CHECK(copies[0].t_start == 100 + off && copies[0].t_end == 140 + off);
    CHECK(out.t_min == 100 + off && out.t_max == 400 + off);
    // each OP mark, by its index among the marks (the timer resolved each when its compute ended)
    CHECK((nodes.asked == std::vector<int32_t>{ 2, 3, 4, 5, 7 }));
}

static void minimal() {
    // each layer's first op marked; a mark's n_ops counts the ops up to the next mark
    lookup                              nodes;
    std::vector<ggml_cuda_profile_mark> m = {
        op(&nodes.fake[0], 10, 0, 2),  // layer 0: nodes 0, 1
        op(&nodes.fake[2], 50, 0, 3),  // layer 1: nodes 2, 3, 4
        op(&nodes.fake[5], 90, 0, 1),  // layer 2
        op(&nodes.fake[6], 95, 0, 2),  // no layer (the output)
        mark(GGML_CUDA_PROFILE_GRAPH_END, 120),
        // a second graph compute (a replay), its first mark never ran: layer 0 unknown
        op(&nodes.fake[0], 0, 0, 2, 0, 1),
        op(&nodes.fake[2], 230, 0, 3, 0, 1),
        mark(GGML_CUDA_PROFILE_GRAPH_END, 300, 0, nullptr, 0, 1),
    };
    m[5].valid = 0;
    std::vector<op_rec>    ops;
    std::vector<layer_rec> layers;
    std::vector<busy_rec>  busy;
    std::vector<gpu_copy>  copies;
    gpu_walk_out           out{ ops, layers, busy, copies };
    const int64_t          lost = walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 2, false, nodes, out);
    CHECK(lost == 1);
    CHECK(ops.empty());
    CHECK(layers.size() == 4);
    CHECK(layers[0].layer == 0 && layers[0].t_start == 10 && layers[0].t_end == 50 && layers[0].n_ops == 2);
    CHECK(layers[1].layer == 1 && layers[1].t_start == 50 && layers[1].t_end == 90 && layers[1].n_ops == 3);
    CHECK(layers[2].layer == 2 && layers[2].t_start == 90 && layers[2].t_end == 95 && layers[2].n_ops == 1);
    CHECK(layers[3].layer == 1 && layers[3].t_start == 230 && layers[3].t_end == 300 && layers[3].device == 2);
    // the first compute's busy stretch; the second's start never ran
    CHECK(busy.size() == 1 && busy[0].t_start == 10 && busy[0].t_end == 120 && busy[0].n_ops == 8);
}

static void hostile() {
    // a stream out of range, a mark of no node of the graph, an op never ended, time going back
    lookup                              nodes;
    ggml_tensor                         other = {};
    std::vector<ggml_cuda_profile_mark> m     = {
        op(&nodes.fake[0], 100, 99),  // stream out of range: lost
        op(&other, 110),              // not a node of the graph: lost
        op(&nodes.fake[1], 120),
        op(&nodes.fake[2], 90),  // before the previous mark on its stream: node 1 lost
        op(&nodes.fake[3], 150, -7),
        mark(GGML_CUDA_PROFILE_COPY_END, 160, GGML_CUDA_PROFILE_THREAD_STREAM, &nodes.fake[0], 8),  // no begin
    };
    std::vector<op_rec>    ops;
    std::vector<layer_rec> layers;
    std::vector<busy_rec>  busy;
    std::vector<gpu_copy>  copies;
    gpu_walk_out           out{ ops, layers, busy, copies };
    const int64_t          lost = walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 0, true, nodes, out);
    // stream 99, the foreign node, node 1 (time back), node 2 (never ended), stream -7
    CHECK(lost == 5);
    CHECK(ops.empty() && busy.empty() && copies.empty());
}

int main() {
    detailed();
    minimal();
    hostile();
    printf("ok\n");
    return 0;
}
