#include "llama-instr-testing.h"

#include "ggml-backend.h"
#include "ggml-cpu-instr.h"
#include "ggml-cpu.h"
#include "llama-instr-memory.h"
#include "llama-instr-registry.h"
#include "llama-instr-timing.h"
#include "llama-instr.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#if defined(__GLIBC__)
#    include <dlfcn.h>
#    include <unwind.h>
#endif

namespace {

std::atomic<int64_t> g_fail_at{ 0 };  // 0: disarmed
std::atomic<int64_t> g_seen{ 0 };
std::atomic<int64_t> g_failed{ 0 };

thread_local bool t_inside = false;  // the unwinder and dladdr() may allocate themselves

#if defined(__GLIBC__)
enum frame_kind : unsigned char {
    FRAME_OTHER,
    FRAME_INSTR,     // a llama_instr function (C API, hook or internal, all exported from libllama)
    FRAME_BOUNDARY,  // libffi: above it is Python (ctypes), which calls no llama_instr code
};

// What is the code at `pc`? dladdr is slow: the answers are cached per thread, direct-mapped by
// address.
frame_kind classify(uintptr_t pc) {
    constexpr size_t           N = 4096;
    thread_local uintptr_t     keys[N];
    thread_local unsigned char vals[N];
    const size_t               slot = (pc >> 2) % N;
    if (keys[slot] == pc) {
        return (frame_kind) vals[slot];
    }
    Dl_info    info;
    frame_kind kind = FRAME_OTHER;
    if (dladdr((void *) pc, &info)) {
        if (info.dli_sname &&
            (strncmp(info.dli_sname, "llama_instr_", 12) == 0 ||
             strncmp(info.dli_sname, "_ZN11llama_instr", 16) == 0) &&
            strncmp(info.dli_sname, "llama_instr_test_", 17) != 0) {
            kind = FRAME_INSTR;
        } else if (info.dli_fname && strstr(info.dli_fname, "libffi")) {
            kind = FRAME_BOUNDARY;
        }
    }
    keys[slot] = pc;
    vals[slot] = kind;
    return kind;
}

struct walk {
    int  depth = 0;
    bool found = false;
};

_Unwind_Reason_Code visit(struct _Unwind_Context * uctx, void * arg) {
    auto * w = (walk *) arg;
    if (w->depth++ == 0) {  // this function's own frame
        return _URC_NO_REASON;
    }
    const frame_kind kind = classify(_Unwind_GetIP(uctx));
    if (kind == FRAME_INSTR) {
        w->found = true;
    }
    return kind != FRAME_OTHER || w->depth >= 48 ? _URC_END_OF_STACK : _URC_NO_REASON;
}
#endif

// Is a llama_instr function on the stack? Armed, every allocation of the process walks its stack:
// the walk stops at the first llama_instr frame, or where Python calls in (walks of up to 48
// frames, through Python's own, made tests/test_alloc_failure.py take 49 CPU-s instead of 16).
bool for_llama_instr() {
#if defined(__GLIBC__)
    walk w;
    _Unwind_Backtrace(visit, &w);
    return w.found;
#else
    return false;
#endif
}

bool inject_failure() {
    if (g_fail_at.load(std::memory_order_relaxed) == 0 || t_inside) {
        return false;
    }
    t_inside      = true;
    const bool us = for_llama_instr();
    t_inside      = false;
    if (!us) {
        return false;
    }
    if (g_seen.fetch_add(1, std::memory_order_relaxed) + 1 == g_fail_at.load(std::memory_order_relaxed)) {
        g_failed.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    return false;
}

void * alloc(std::size_t n) {
    if (inject_failure()) {
        throw std::bad_alloc();
    }
    void * p = std::malloc(n ? n : 1);
    if (!p) {
        throw std::bad_alloc();
    }
    return p;
}

}  // namespace

void llama_instr_test_fail_alloc(int64_t n) {
    g_fail_at.store(0, std::memory_order_relaxed);
    g_seen.store(0, std::memory_order_relaxed);
    g_failed.store(0, std::memory_order_relaxed);
    g_fail_at.store(n, std::memory_order_relaxed);
}

int64_t llama_instr_test_failed_allocs(void) {
    return g_failed.load(std::memory_order_relaxed);
}

int64_t llama_instr_test_memory_caches(void) {
    try {
        return (int64_t) llama_instr::memory_caches_known();
    } catch (...) {  // (the mutex)
        return -1;
    }
}

int64_t llama_instr_test_ctx_states(void) {
    try {
        auto &                      s = llama_instr::S();
        std::lock_guard<std::mutex> lock(s.mtx);
        return (int64_t) s.ctxs.size();
    } catch (...) {  // (the mutex)
        return -1;
    }
}

// the custom op: thread 0 copies the input, the others only take slow_ns
static void uneven_op(ggml_tensor * dst, const ggml_tensor * a, int ith, int nth, void * userdata) {
    (void) nth;
    if (ith == 0) {
        memcpy(dst->data, a->data, ggml_nbytes(dst));
    } else {
        std::this_thread::sleep_for(std::chrono::nanoseconds(*(const int64_t *) userdata));
    }
}

int32_t llama_instr_test_last_op_ns(int32_t n_threads, int64_t slow_ns, int64_t * last_op_ns) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev || !last_op_ns) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto               set_profiler =
        (ggml_backend_cpu_set_profiler_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_profiler");
    auto set_threads =
        (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    if (!set_profiler || !set_threads || !backend) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
    set_threads(backend, n_threads);

    ggml_init_params params = { 1024 * 1024, nullptr, false };
    ggml_context *   ctx    = ggml_init(params);
    ggml_tensor *    a      = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4096);
    memset(a->data, 0, ggml_nbytes(a));
    ggml_tensor * out = ggml_map_custom1(ctx, ggml_scale(ctx, a, 2.0f), uneven_op, GGML_N_TASKS_MAX, &slow_ns);
    ggml_cgraph * gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    ggml_cpu_profile_op ops[8] = {};
    ggml_cpu_profiler   prof   = {};
    prof.ops                   = ops;
    prof.cap                   = 8;
    set_profiler(backend, &prof);
    const ggml_status status = ggml_backend_graph_compute(backend, gf);
    set_profiler(backend, nullptr);
    ggml_backend_free(backend);
    ggml_free(ctx);
    if (status != GGML_STATUS_SUCCESS || prof.n_ops < 1) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
    *last_op_ns = ops[prof.n_ops - 1].t_end - ops[prof.n_ops - 1].t_start;
    return LLAMA_INSTR_OK;
}

// The replaced global allocation functions (the aligned and nothrow forms keep the defaults, which
// llama_instr code does not use).
void * operator new(std::size_t n) {
    return alloc(n);
}

void * operator new[](std::size_t n) {
    return alloc(n);
}

void operator delete(void * p) noexcept {
    std::free(p);
}

void operator delete[](void * p) noexcept {
    std::free(p);
}

void operator delete(void * p, std::size_t) noexcept {
    std::free(p);
}

void operator delete[](void * p, std::size_t) noexcept {
    std::free(p);
}

void llama_instr_test_defer_steps(int32_t on) {
    llama_instr::g_llama_instr_defer_steps.store(on != 0, std::memory_order_relaxed);
}

void llama_instr_test_async_devices(int32_t on) {
    llama_instr::g_llama_instr_test_async.store(on != 0, std::memory_order_relaxed);
}

void llama_instr_test_write_delay(int64_t us) {
    llama_instr::g_llama_instr_write_delay_us.store(std::max<int64_t>(0, us), std::memory_order_relaxed);
}
