// Patch 0006's reads when the profiler's mark buffer fills up: a chain of
// argsorts on the Vulkan backend (each next one gathering rows by the ids the
// last one wrote, so that ggml-vulkan records a barrier behind each), every
// argsort read back, with room for only a few marks. A read that was recorded
// must name a mark written for it (the mark's node is the tensor read) and hold
// that tensor's bytes; reads past the room are dropped. Before the fix a read
// made when the buffer was full named the last mark written, another op's, and
// was taken as having run. tests/test_moe_vulkan.py builds it against the
// patched tree and runs it on lavapipe.
#include "check.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-vulkan-instr.h"
#include "ggml-vulkan.h"
#include "ggml.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

constexpr int N_COLS = 8;  // ids per row
constexpr int N_USED = 2;  // ids read per row
constexpr int N_ROWS = 4;
constexpr int N_SORT = 6;  // argsorts in the chain

static const ggml_tensor * read_argsort(void *, ggml_tensor * const * nodes, int32_t n_nodes, size_t * row_bytes) {
    for (int32_t k = 0; k < n_nodes; k++) {
        if (nodes[k]->op == GGML_OP_ARGSORT) {
            *row_bytes = N_USED * sizeof(int32_t);
            return nodes[k];
        }
    }
    return nullptr;
}

int main() {
    ggml_backend_t vk = ggml_backend_vk_init(0);
    CHECK(vk != nullptr);
    ggml_backend_reg_t reg = ggml_backend_vk_reg();
    auto               set_profiler =
        (ggml_backend_vk_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_vk_set_profiler");
    auto collect =
        (ggml_backend_vk_profiler_collect_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_vk_profiler_collect");
    CHECK(set_profiler && collect);

    ggml_init_params           params = { 1024 * 1024, nullptr, true };
    ggml_context *             ctx    = ggml_init(params);
    ggml_tensor *              x      = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N_COLS, N_ROWS);
    ggml_tensor *              first  = x;
    ggml_cgraph *              gf     = ggml_new_graph(ctx);
    std::vector<ggml_tensor *> sorts;
    for (int i = 0; i < N_SORT; i++) {
        ggml_tensor * s = ggml_argsort(ctx, ggml_scale(ctx, x, 1.0f + i), GGML_SORT_ORDER_DESC);
        sorts.push_back(s);
        // the next input: x's rows gathered by the first row's ids (reads s: a
        // barrier first)
        x = ggml_get_rows(ctx, x, ggml_view_1d(ctx, s, N_ROWS, 0));
        ggml_build_forward_expand(gf, x);
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, vk);
    CHECK(buf != nullptr);
    std::vector<float> data(N_COLS * N_ROWS);
    for (size_t i = 0; i < data.size(); i++) {
        data[i] = (float) ((i * 7919) % 97);
    }
    ggml_backend_tensor_set(first, data.data(), 0, data.size() * sizeof(float));

    // room for the buffer's begin marks, a few ops and reads: less than the graph
    // needs
    std::vector<ggml_vk_profile_mark> marks(8);
    std::vector<ggml_vk_profile_read> reads(16);
    std::vector<uint8_t>              readback(64 * 1024);
    ggml_vk_profiler                  p = {};
    p.marks                             = marks.data();
    p.cap                               = (int32_t) marks.size();
    p.read                              = read_argsort;
    p.reads                             = reads.data();
    p.reads_cap                         = (int32_t) reads.size();
    p.readback                          = readback.data();
    p.readback_cap                      = readback.size();
    CHECK(set_profiler(vk, &p) == 0);
    CHECK(ggml_backend_graph_compute(vk, gf) == GGML_STATUS_SUCCESS);
    ggml_backend_synchronize(vk);
    CHECK(collect(vk, &p, 0, p.n_marks) == 0);
    set_profiler(vk, nullptr);
    CHECK(p.n_lost > 0);  // the buffer did fill up

    const int32_t n_reads = std::min(p.n_reads, p.reads_cap);
    for (int32_t k = 0; k < n_reads; k++) {
        const ggml_vk_profile_read & r = p.reads[k];
        CHECK(r.mark >= 0 && r.mark < p.cap);
        CHECK(marks[r.mark].node == r.tensor);  // its own mark, not another op's
    }
    int n_checked = 0;
    for (int32_t k = 0; k < n_reads; k++) {
        const ggml_vk_profile_read & r = p.reads[k];
        if (!marks[r.mark].valid) {
            continue;
        }
        std::vector<int32_t> ids(N_COLS * N_ROWS);
        ggml_backend_tensor_get((ggml_tensor *) r.tensor, ids.data(), 0, ids.size() * sizeof(int32_t));
        for (int row = 0; row < N_ROWS; row++) {
            // row `row` of the read: r.row_bytes from its start, rows nb[1] apart as
            // in the tensor
            CHECK(memcmp(readback.data() + r.offset + (size_t) row * r.tensor->nb[1], ids.data() + row * N_COLS,
                         N_USED * sizeof(int32_t)) == 0);
        }
        n_checked++;
    }
    CHECK(n_checked >= 1);
    printf("%d reads checked, %d lost, %d marks lost\n", n_checked, p.n_reads_lost, p.n_lost);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(vk);
    return 0;
}
