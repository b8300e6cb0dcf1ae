// The walk of a GPU's timing marks (llama-instr-gpu-marks.h), driven with marks made up here in
// the shapes ggml-cuda writes them (patch 0013): a graph compute's ops on the main stream, one on
// a side stream joined back, copies on the thread's stream, a mark that never ran, a mark of no
// node of the graph, the calibration mark after a compute's end mark. Every expected interval is computed here from the marks' times.
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

// what a walk wrote, in the vectors gpu_walk_out names
struct walked {
    std::vector<op_rec>    ops;
    std::vector<layer_rec> layers;
    std::vector<busy_rec>  busy;
    std::vector<gpu_copy>  copies;
    gpu_walk_out           out{ ops, layers, busy, copies };
};

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
    walked        w;
    const int64_t lost = walk_gpu_marks(m.data(), (int32_t) m.size(), off, 7, true, nodes, w.out);
    CHECK(lost == 0);
    // ops in the order their intervals closed; each ends at the next mark on its stream
    CHECK(w.ops.size() == 5);
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
    for (size_t i = 0; i < w.ops.size(); i++) {
        CHECK(w.ops[i].idx == expect[i].idx);
        CHECK(w.ops[i].layer == expect[i].layer);
        CHECK(w.ops[i].n_fused == expect[i].n_fused);
        CHECK(w.ops[i].device == 7);
        CHECK(w.ops[i].t_start == expect[i].a + off && w.ops[i].t_end == expect[i].b + off);
        CHECK(w.ops[i].thread_begin == -1);
    }
    CHECK(w.layers.empty());  // (DETAILED: the timer makes them from the ops)
    CHECK(w.busy.size() == 1);
    CHECK(w.busy[0].device == 7 && w.busy[0].split == 0 && w.busy[0].n_ops == 5);
    CHECK(w.busy[0].t_start == 200 + off && w.busy[0].t_end == 400 + off);
    CHECK(w.copies.size() == 1);
    CHECK(w.copies[0].tensor == &nodes.fake[0] && w.copies[0].bytes == 4096);
    CHECK(w.copies[0].t_start == 100 + off && w.copies[0].t_end == 140 + off);
    CHECK(w.out.t_min == 100 + off && w.out.t_max == 400 + off);
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
    walked        w;
    const int64_t lost = walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 2, false, nodes, w.out);
    CHECK(lost == 1);
    CHECK(w.ops.empty());
    CHECK(w.layers.size() == 4);
    CHECK(w.layers[0].layer == 0 && w.layers[0].t_start == 10 && w.layers[0].t_end == 50 && w.layers[0].n_ops == 2);
    CHECK(w.layers[1].layer == 1 && w.layers[1].t_start == 50 && w.layers[1].t_end == 90 && w.layers[1].n_ops == 3);
    CHECK(w.layers[2].layer == 2 && w.layers[2].t_start == 90 && w.layers[2].t_end == 95 && w.layers[2].n_ops == 1);
    CHECK(w.layers[3].layer == 1 && w.layers[3].t_start == 230 && w.layers[3].t_end == 300 && w.layers[3].device == 2);
    // the first compute's busy stretch; the second's start never ran
    CHECK(w.busy.size() == 1 && w.busy[0].t_start == 10 && w.busy[0].t_end == 120 && w.busy[0].n_ops == 8);
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
    walked        w;
    const int64_t lost = walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 0, true, nodes, w.out);
    // stream 99, the foreign node, node 1 (time back), node 2 (never ended), stream -7
    CHECK(lost == 5);
    CHECK(w.ops.empty() && w.busy.empty() && w.copies.empty());
}

static void calibrated() {
    // a compute's CALIB mark 12 ns after its end mark: each op starts 12 ns after its own mark;
    // the next compute's CALIB never ran, so its ops start at their marks
    lookup                              nodes;
    std::vector<ggml_cuda_profile_mark> m = {
        op(&nodes.fake[0], 200),
        op(&nodes.fake[1], 250),
        op(&nodes.fake[2], 255),  // shorter than a mark: starts at its end
        mark(GGML_CUDA_PROFILE_GRAPH_END, 300),
        mark(GGML_CUDA_PROFILE_CALIB, 312),
        op(&nodes.fake[0], 410, 0, 1, 0, 1),
        mark(GGML_CUDA_PROFILE_GRAPH_END, 450, 0, nullptr, 0, 1),
        mark(GGML_CUDA_PROFILE_CALIB, 0, 0, nullptr, 0, 1),
    };
    m[7].valid = 0;
    walked        w;
    CHECK(walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 0, true, nodes, w.out) == 0);
    CHECK(w.ops.size() == 4);
    CHECK(w.ops[0].t_start == 212 && w.ops[0].t_end == 250);
    CHECK(w.ops[1].t_start == 255 && w.ops[1].t_end == 255);
    CHECK(w.ops[2].t_start == 267 && w.ops[2].t_end == 300);
    CHECK(w.ops[3].t_start == 410 && w.ops[3].t_end == 450);
    // the busy stretches keep the marks' time: from the first op's mark to the end mark
    CHECK(w.busy.size() == 2 && w.busy[0].t_start == 200 && w.busy[0].t_end == 300 && w.busy[1].t_start == 410);
    // MINIMAL: a span starts past the mark of its first op
    w.ops.clear();
    w.busy.clear();
    m[0].n_ops = 2;
    m.erase(m.begin() + 1);  // nodes 0, 1 of layer 0 under one mark
    CHECK(walk_gpu_marks(m.data(), 4, 0, 0, false, nodes, w.out) == 0);
    CHECK(w.layers.size() == 2);
    CHECK(w.layers[0].layer == 0 && w.layers[0].t_start == 212 && w.layers[0].t_end == 255 && w.layers[0].n_ops == 2);
    CHECK(w.layers[1].layer == 1 && w.layers[1].t_start == 267 && w.layers[1].t_end == 300);
}

int main() {
    detailed();
    calibrated();
    minimal();
    hostile();
    printf("ok\n");
    return 0;
}
