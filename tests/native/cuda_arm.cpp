// The CUDA op timer's arm, with no device: the timer made on profiler entry points of this file
// (make_cuda_op_timer_from), armed for a graph as a decode arms it (its llama_context) and as an
// encoder's compute does (mtmd's clip graph: no llama_context). Armed with no context it holds
// room for one compute of the graph, every op selected at DETAILED and the layers' first ops at
// MINIMAL, and hands the profiler to the backend.
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "ggml-cuda-instr.h"
#include "ggml.h"
#include "llama-instr-ops.h"
#include "llama-instr-session.h"

#include <cstdio>

using namespace llama_instr;

static ggml_cuda_profiler * g_set    = nullptr;  // the profiler last handed to the backend
static int                  g_n_sets = 0;

static int fake_set_profiler(ggml_backend_t, ggml_cuda_profiler * p) {
    g_set = p;
    g_n_sets++;
    return 0;
}

static int fake_collect(ggml_backend_t, ggml_cuda_profiler *, int32_t, int32_t) {
    return 0;
}

static int fake_clock_pair(ggml_backend_t, int32_t, int64_t (*)(void), ggml_gpu_clock_pair *) {
    return -1;
}

int main() {
    ggml_init_params params = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context *   g      = ggml_init(params);
    ggml_tensor *    a      = ggml_new_tensor_2d(g, GGML_TYPE_F32, 8, 4);
    ggml_tensor *    b      = ggml_new_tensor_2d(g, GGML_TYPE_F32, 8, 4);
    ggml_tensor *    out    = ggml_mul(g, ggml_add(g, a, b), ggml_gelu(g, a));
    ggml_cgraph *    gf     = ggml_new_graph(g);
    ggml_build_forward_expand(gf, out);
    const int64_t n_nodes = ggml_graph_n_nodes(gf);
    CHECK(n_nodes == 3);

    CHECK(!make_cuda_op_timer_from(nullptr, 0, fake_set_profiler, fake_collect, nullptr));
    auto timer = make_cuda_op_timer_from(nullptr, 0, fake_set_profiler, fake_collect, fake_clock_pair);
    CHECK(timer);

    ctx_state st;
    st.level = LLAMA_INSTR_LEVEL_DETAILED;
    st.step  = 1;
    CHECK(timer->arm(st, nullptr, gf));
    CHECK(g_n_sets == 1 && g_set != nullptr);
    CHECK(g_set->marks != nullptr && g_set->n_marks == 0);
    CHECK(g_set->cap >= 4 * n_nodes + 64);  // a compute's marks: its ops, splits and copies
    CHECK(g_set->selection == 1);           // every op
    timer->disarm();
    CHECK(g_n_sets == 2 && g_set == nullptr);

    // the next encode, at MINIMAL: the layers' first ops only, in the room it holds
    st.level = LLAMA_INSTR_LEVEL_MINIMAL;
    st.step  = 2;
    CHECK(timer->arm(st, nullptr, gf));
    CHECK(g_set != nullptr && g_set->selection == 2 && g_set->want != nullptr);
    timer->disarm();

    ggml_free(g);
    printf("ok\n");
    return 0;
}
