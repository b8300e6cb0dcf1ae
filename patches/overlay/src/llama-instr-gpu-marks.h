#pragma once

// llamacpp-instr: a GPU's timing marks (ggml-cuda-instr.h) turned into a compute's records: each
// marked op's interval runs from its mark to the next mark on the same stream; each graph compute
// from its first op's mark to its end mark is the device's busy time; each copy's marks bound its
// time on the device's stream. Apart from the CUDA op timer (llama-instr-ops-cuda.cpp), which
// reads the marks and the clock, so that a unit test drives the walk with marks it makes up.

#include "ggml-cuda-instr.h"
#include "llama-instr-session.h"

#include <cstdint>
#include <vector>

namespace llama_instr {

// where an op's node is in the graph its compute ran: its node index (-1: not a node of that
// graph), its layer (-1: none), and the index into the compute's splits of its split (-1: none)
struct gpu_node {
    int32_t idx;
    int32_t layer;
    int32_t split;
};

// what the walk asks about the graph of each marked op
class gpu_node_lookup {
  public:
    virtual ~gpu_node_lookup() = default;

    // the node of mark k (an OP mark), which names `node`
    virtual gpu_node find(int32_t k, const ggml_tensor * node) = 0;
};

// a copy between the host and the device, timed on the device's stream (on the host clock)
struct gpu_copy {
    const ggml_tensor * tensor;
    int64_t             bytes;
    int32_t             flags;  // GGML_CUDA_PROFILE_HOST_TO_DEVICE, ...
    int64_t             t_start, t_end;
};

struct gpu_walk_out {
    std::vector<op_rec> &    ops;                // DETAILED: one per marked op, in mark order
    std::vector<layer_rec> & layers;             // MINIMAL: the layer spans
    std::vector<busy_rec> &  busy;               // one per graph compute whose start and end ran
    std::vector<gpu_copy> &  copies;
    int64_t                  t_min = INT64_MAX;  // the first and last time read (host clock)
    int64_t                  t_max = INT64_MIN;
};

// Walks marks[0, n): device times plus `offset` are host times. `detailed`: an op record per
// marked op; else layer spans of the runs of ops between marks (each run is of one layer: the
// profiler marked every op that begins a layer). An op's time starts after its own mark: the
// interval from a graph compute's GRAPH_END mark to the CALIB mark right after it (nothing
// between) is what a mark takes in that compute, and each op's or span's start is moved past it.
// Returns the marked ops whose interval is unknown: a mark that never ran, on a stream out of
// range, with no later mark on its stream, or not of the graph indexed.
// The room (in marks) the CUDA op timer holds for a step's marks before one of its computes, of a
// graph of n_nodes nodes: the marks of the step's earlier computes (`used`) stay until the host
// synchronizes after the step, so a step of many ubatches needs room for all of them, and each
// time the room grows the backend waits for its streams. `have` is the room held; `computes` how
// many computes a decode makes (ggml's batch over its ubatch). At a step's first compute (`used`
// 0) the room is made enough for `computes` of this graph, so that a decode's later computes do
// not grow it; a step of more computes grows it by half again. Returns `have` when it does.
// At most GPU_MARKS_COMPUTES_AHEAD computes are made room for ahead (a batch of many small
// ubatches holds that much room only once a step needs it).
constexpr int64_t GPU_MARKS_COMPUTES_AHEAD = 16;
int64_t           gpu_marks_room(int64_t have, int64_t used, int64_t n_nodes, int64_t computes);

int64_t walk_gpu_marks(const ggml_cuda_profile_mark * marks,
                       int32_t                        n,
                       int64_t                        offset,
                       int32_t                        device,
                       bool                           detailed,
                       gpu_node_lookup &              nodes,
                       gpu_walk_out &                 out);

}  // namespace llama_instr
