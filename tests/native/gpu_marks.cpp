// The walk of a GPU's timing marks (llama-instr-gpu-marks.h), driven with marks made up here in
// the shapes ggml-cuda writes them (patch 0013): a graph compute's ops on the main stream, one on
// a side stream joined back, copies on the thread's stream, a mark that never ran, a mark of no
// node of the graph, the calibration mark after a compute's end mark. Every expected interval is computed here from the marks' times.
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "ggml-cuda-instr.h"
#include "llama-instr-gpu-marks.h"

#include <algorithm>
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

// The room the CUDA op timer holds for a step's marks (gpu_marks_room), as it asks before each
// compute: a session of steps, each of some computes (ubatches) of a graph of N nodes, each compute
// appending M marks that stay until the step ends. Counts the times the room grew (each a wait
// for the backend's streams and a new pinned buffer), per compute of the step.
struct room_sim {
    static constexpr int64_t N = 582;  // Llama-3.2-1B's decode graph (docs/performance.md)
    static constexpr int64_t M = 372;  // its 358 ops marked, the end and its calibration, 6 copies

    int64_t              computes;  // ggml's batch over its ubatch
    int64_t              room = 0;
    int64_t              most = 0;  // the most marks a step held
    std::vector<int32_t> grew;      // per step: the computes at which the room grew

    void step(int64_t n_computes) {
        grew.push_back(0);
        int64_t used = 0;
        for (int64_t u = 0; u < n_computes; u++) {
            const int64_t r = gpu_marks_room(room, used, N, computes);
            CHECK(r >= room && r >= used + M);  // never shrinks; this compute's marks fit
            if (r != room) {
                grew.back() += u == 0 ? 1 : 1000;  // at the step's first compute, or later
                room = r;
            }
            used += M;
        }
        most = std::max(most, used);
    }
};

static void room() {
    // a 2048-token batch in ubatches of 512: one token, then a prompt of four ubatches, then
    // generation; the room grows once, at the first compute, for every decode of the batch
    room_sim s{ 4 };
    s.step(1);
    s.step(4);
    s.step(1);
    s.step(4);
    CHECK((s.grew == std::vector<int32_t>{ 1, 0, 0, 0 }));
    CHECK(s.room <= 4 * (4 * room_sim::N + 64));  // no more than the batch's computes need
    // a decode of more computes than the batch's ubatches (sequences split into smaller ones):
    // the room grows by half again as it runs out, not at every compute, and not in the next such
    // decode
    room_sim b{ 4 };
    b.step(64);
    int32_t later = b.grew[0] / 1000;
    CHECK(later >= 1 && later <= 8);
    b.step(64);
    b.step(3);
    CHECK(b.grew[1] == 0 && b.grew[2] == 0);
    CHECK(b.room <= 2 * b.most);
    // one compute a decode (llama-cpp-python's batch of 512 in one ubatch): room for one
    room_sim one{ 1 };
    for (int i = 0; i < 8; i++) {
        one.step(1);
    }
    CHECK(one.grew[0] == 1 && one.room == 4 * room_sim::N + 64);
    CHECK(std::count(one.grew.begin(), one.grew.end(), 0) == 7);
}

// With GGML_CUDA_GRAPH_OPT=1 ggml-cuda runs a layer's Q, K and V branches on side streams 1-3:
// the main stream forks them after the attention norm and runs nothing until they join it at the
// attention. The marks as patch 0013 lays them there: at DETAILED, a FORK mark on the main stream
// where it forks, each side stream's ops marked on their streams, a JOIN mark on each side stream.
static void concurrent() {
    lookup                              nodes;  // node 0: the fork's op; 1-5 the branches'; 6 the join's
    nodes.layers = { 3, 3, 3, 3, 3, 3, 3, 4 };
    std::vector<ggml_cuda_profile_mark> m = {
        op(&nodes.fake[0], 100),  // attn_norm, fused (RMS_NORM, MUL)
        mark(GGML_CUDA_PROFILE_FORK, 130),
        op(&nodes.fake[1], 140, 1),  // Q
        op(&nodes.fake[2], 141, 2),  // K
        op(&nodes.fake[3], 142, 3),  // V
        op(&nodes.fake[4], 170, 1),  // Q's rope
        op(&nodes.fake[5], 160, 2),  // K's rope
        mark(GGML_CUDA_PROFILE_JOIN, 200, 1),
        mark(GGML_CUDA_PROFILE_JOIN, 185, 2),
        mark(GGML_CUDA_PROFILE_JOIN, 190, 3),
        op(&nodes.fake[6], 205),  // the attention, on the main stream after the join
        op(&nodes.fake[7], 230),  // the next layer's first op
        mark(GGML_CUDA_PROFILE_GRAPH_END, 260),
        mark(GGML_CUDA_PROFILE_CALIB, 261),
    };
    walked w;
    CHECK(walk_gpu_marks(m.data(), (int32_t) m.size(), 0, 0, true, nodes, w.out) == 0);
    CHECK(w.ops.size() == 8);
    // each op from past its mark (a mark takes 1 ns here) to its stream's next mark
    const int64_t want[8][2] = {
        { 101, 130 }, { 141, 170 }, { 142, 160 }, { 143, 190 }, { 171, 200 }, { 161, 185 }, { 206, 230 }, { 231, 260 },
    };
    const int64_t region_start = 140, region_end = 200;  // the side streams' first mark, last join
    int32_t       seen         = 0;
    for (const op_rec & r : w.ops) {
        CHECK(r.idx >= 0 && r.idx < 8);
        CHECK(r.t_start == want[r.idx][0] && r.t_end == want[r.idx][1]);
        seen |= 1 << r.idx;
        const bool inside = r.idx >= 1 && r.idx <= 5;
        // no op outside the region overlaps it: the fork's op ends where the side streams begin
        CHECK(inside ? r.t_start >= region_start && r.t_end <= region_end :
                       r.t_end <= region_start || r.t_start >= region_end);
    }
    CHECK(seen == 0xff);
    CHECK(w.busy.size() == 1 && w.busy[0].t_start == 100 && w.busy[0].t_end == 260 && w.busy[0].n_ops == 8);

    // MINIMAL (the layers' first ops marked, no FORK mark): the side streams' ops are counted to
    // the layer's mark, whose span runs through the region as the layer's time does; the joins end
    // nothing
    std::vector<ggml_cuda_profile_mark> n = {
        op(&nodes.fake[0], 100, 0, 7),  // layer 3: nodes 0-6, the branches' five among them
        mark(GGML_CUDA_PROFILE_JOIN, 200, 1),
        mark(GGML_CUDA_PROFILE_JOIN, 185, 2),
        mark(GGML_CUDA_PROFILE_JOIN, 190, 3),
        op(&nodes.fake[7], 230),
        mark(GGML_CUDA_PROFILE_GRAPH_END, 260),
    };
    walked v;
    CHECK(walk_gpu_marks(n.data(), (int32_t) n.size(), 0, 0, false, nodes, v.out) == 0);
    CHECK(v.layers.size() == 2);
    CHECK(v.layers[0].layer == 3 && v.layers[0].t_start == 100 && v.layers[0].t_end == 230 && v.layers[0].n_ops == 7);
    CHECK(v.layers[1].layer == 4 && v.layers[1].t_start == 230 && v.layers[1].t_end == 260);
}

int main() {
    room();
    concurrent();
    detailed();
    calibrated();
    minimal();
    hostile();
    printf("ok\n");
    return 0;
}
