// The memory budget's bookkeeping under a failing backend (issue: pending bytes and a sum that
// wraps). A budget of 1 MiB on the CPU device:
// - a buffer type whose alloc_buffer throws (a backend's allocation that raised instead of
//   returning NULL) is passed for 800 KiB: the exception reaches the caller, and the bytes the
//   budget held for it are released, so that a CPU buffer of 800 KiB fits the budget afterwards;
// - a size whose sum with the bytes in use wraps past SIZE_MAX is refused by the budget (the
//   failure says so), not passed to the device.
// tests/test_native_units.py builds it against the patched tree.
#include "check.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "llama-instr.h"

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

static const char * thrower_name(ggml_backend_buffer_type_t) {
    return "Thrower";
}

static ggml_backend_buffer_t thrower_alloc(ggml_backend_buffer_type_t, size_t) {
    throw std::runtime_error("the device was lost");
}

static size_t thrower_alignment(ggml_backend_buffer_type_t) {
    return 64;
}

int main() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    CHECK(cpu != nullptr);
    ggml_backend_buffer_type_t host = ggml_backend_dev_buffer_type(cpu);
    CHECK(llama_instr_set_memory_budget("CPU=1M") == LLAMA_INSTR_OK);

    ggml_backend_buffer_type thrower = {};
    thrower.iface.get_name           = thrower_name;
    thrower.iface.alloc_buffer       = thrower_alloc;
    thrower.iface.get_alignment      = thrower_alignment;
    thrower.device                   = cpu;
    bool threw                       = false;
    try {
        ggml_backend_buft_alloc_buffer(&thrower, 800 * 1024);
    } catch (const std::runtime_error &) {
        threw = true;
    }
    CHECK(threw);
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(host, 800 * 1024);
    CHECK(b != nullptr);  // the thrown allocation's 800 KiB are not held any more

    // 800 KiB in use: in use + this size wraps to less than the budget
    const size_t huge = SIZE_MAX - 4096;
    CHECK(ggml_backend_buft_alloc_buffer(host, huge) == nullptr);
    char buf[4096];
    CHECK(llama_instr_memory_failure(buf, sizeof(buf)) > 0);
    const std::string failure = buf;
    CHECK(failure.find("\"by_budget\":true") != std::string::npos);
    ggml_backend_buffer_free(b);
    printf("ok\n");
    return 0;
}
