// CUPTI's record of every kernel, memory copy and memset a process runs, for bench/gpu_check.sh: an
// independent measure of the CUDA op timer. Preloaded (LD_PRELOAD) into the process; at its start
// it enables CUPTI's concurrent-kernel, memcpy and memset activity, and at its exit writes one line
// per record to $CUPTI_TRACE_OUT:
//
//   start_ns end_ns stream graph_id graph_node_id name
//
// where a copy's name is "[memcpy KIND BYTES]" (KIND: HtoD, DtoH, DtoD, ... as CUPTI names the
// copy's direction) and a memset's "[memset BYTES]".
// (CUPTI's own timestamps; graph_node_id is CUPTI's (exec graph id << 32 | node index), not the
// captured node: bench/cupti_join.py joins kernels to ggml's ops by their order between the op
// timer's own mark kernels instead). Built on the GPU machine by gpu_check.sh:
//
//   g++ -shared -fPIC -O2 -I$CUDA/include bench/cupti_trace.cpp -L$CUDA/lib64 -Wl,-rpath,$CUDA/lib64 \
//       -lcupti -o cupti_trace.so

#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct kernel_row {
    uint64_t    start, end;
    uint32_t    stream, graph;
    uint64_t    node;
    std::string name;
};

std::mutex              g_mtx;
std::vector<kernel_row> g_rows;
constexpr size_t        BUF_SIZE = 8 << 20;

std::string copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
            return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
            return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
            return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
            return "PtoP";
        default:
            return "kind" + std::to_string(kind);
    }
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *buffer      = (uint8_t *) aligned_alloc(8, BUF_SIZE);
    *size        = BUF_SIZE;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid) {
    CUpti_Activity *            rec = nullptr;
    std::lock_guard<std::mutex> lock(g_mtx);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const auto * k = (const CUpti_ActivityKernel9 *) rec;
            g_rows.push_back({ k->start, k->end, k->streamId, k->graphId, k->graphNodeId, k->name ? k->name : "?" });
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto * c = (const CUpti_ActivityMemcpy6 *) rec;
            g_rows.push_back({ c->start, c->end, c->streamId, c->graphId, c->graphNodeId,
                               "[memcpy " + copy_kind(c->copyKind) + " " + std::to_string(c->bytes) + "]" });
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto * s = (const CUpti_ActivityMemset4 *) rec;
            g_rows.push_back({ s->start, s->end, s->streamId, s->graphId, s->graphNodeId,
                               "[memset " + std::to_string(s->bytes) + "]" });
        }
    }
    free(buffer);
}

void write_rows() {
    cuptiActivityFlushAll(1);
    const char * path = getenv("CUPTI_TRACE_OUT");
    FILE *       f    = path ? fopen(path, "w") : nullptr;
    if (!f) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_mtx);
    for (const kernel_row & r : g_rows) {
        fprintf(f, "%llu %llu %u %u %llu %s\n", (unsigned long long) r.start, (unsigned long long) r.end, r.stream,
                r.graph, (unsigned long long) r.node, r.name.c_str());
    }
    fclose(f);
}

struct tracer {
    tracer() {
        if (!getenv("CUPTI_TRACE_OUT")) {
            return;
        }
        cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
        atexit(write_rows);
    }
} g_tracer;

}  // namespace
