#pragma once

// llamacpp-instr: value statistics of each op's output (verbose level). The CPU backend calls
// stats_on_node() on every thread once an op is complete; each thread accumulates its share of
// the output's values (its rows, if the output is not contiguous) into its own slot, and the slots are merged when the step's records are
// formatted, after its end time is taken.

#include "ggml.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llama_instr {

struct expert_log;

// one thread's share of one op's output, a cache line of its own: the threads write theirs for
// the same op at the same time
struct alignas(64) stat_partial {
    float    mn, mx;
    double   sum, sum2;
    int64_t  n, n_nan, n_inf;
    uint32_t gen;  // == stats_buffer::gen when written by the current compute
};

struct stat_row {
    int32_t node;
    double  min, max, mean, std;
    int64_t n_nan, n_inf;
};

struct stats_buffer {
    std::vector<stat_partial> partials;  // [op k][thread]
    int32_t                   max_threads = 0;
    uint32_t                  gen         = 0;

    // before a compute: room for cap ops and max_threads threads (allocates only to grow)
    void prepare(int32_t cap, int32_t max_threads);

    // Merge the partials of op k into `out` (node left to the caller). False if op k has none
    // (an output that is not F32/F16, or a KV cache write).
    bool merge(int32_t k, stat_row & out) const;
};

// node outputs copied as F32 while the graph runs (llama_instr_capture)
struct capture_buffer {
    std::vector<std::string> patterns;  // exact names, or prefixes ending in '*'

    struct slot {
        const ggml_tensor * node;
        std::string         name;
        int64_t             ne[GGML_MAX_DIMS];
        std::vector<float>  data;
        bool                filled;  // written by this compute (set by thread 0)
    };

    // this compute's targets (sized at compute begin); after the compute, its first n_filled
    // slots are the outputs it wrote. A target that no op of the CPU backend wrote (a view or
    // reshape, a node fused into the op after it, a node another backend ran, an output that is
    // not F32/F16) is left out, never served stale.
    std::vector<slot> slots;
    size_t            n_filled = 0;
    bool              matches(const char * name) const;
    slot *            find(const ggml_tensor * t);
};

// what the CPU backend's per-op callback serves: statistics and/or capture
struct on_node_user {
    stats_buffer *   stats   = nullptr;
    capture_buffer * capture = nullptr;
    expert_log *     experts = nullptr;  // llama-instr-experts.h
};

// ggml_cpu_profiler::on_node; `user` is an on_node_user
void on_node(void * user, int32_t k, const ggml_tensor * node, int ith, int nth);

void stats_on_node(stats_buffer & sb, int32_t k, const ggml_tensor * node, int ith, int nth);
void capture_on_node(capture_buffer & cb, const ggml_tensor * node, int ith, int nth);

}  // namespace llama_instr
