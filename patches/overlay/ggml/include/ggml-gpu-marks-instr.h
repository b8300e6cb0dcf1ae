#pragma once

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device timing marks of the GPU backends (llamacpp-instr): what the CUDA and the Vulkan profilers
// share. Each backend's marks and profiler are its own (ggml-cuda-instr.h, ggml-vulkan-instr.h):
// where a mark can be laid and what it says differ (a kernel on a stream, a timestamp query in a
// command buffer). Their hooks have one shape, three proc addresses of the backend's registry:
//
//   "ggml_backend_<name>_set_profiler"      int (ggml_backend_t, struct <its profiler> *): sets
//       (or with NULL unsets) the profiler the backend's computes write marks for; 0 = ok, -1 =
//       refused (nothing is set)
//   "ggml_backend_<name>_profiler_collect"  int (ggml_backend_t, struct <its profiler> *,
//       int32_t begin, int32_t end): once the backend is synchronized, each mark's time in
//       [begin, end) (its `t` and `valid`); 0 = ok, -1 = no times to read
//   "ggml_backend_<name>_clock_pair"        ggml_backend_gpu_clock_pair_t, below: the device's
//       clock beside the host's, which puts the marks on the host's clock

// How a clock pair was taken.
enum ggml_gpu_clock_method {
    GGML_GPU_CLOCK_ANY        = 0,  // asked for: the best the backend has
    GGML_GPU_CLOCK_CALIBRATED = 1,  // the driver's calibrated timestamps (VK_EXT_calibrated_timestamps)
    GGML_GPU_CLOCK_FENCE      = 2,  // a timestamp submitted alone, the host timing its submit and fence
    GGML_GPU_CLOCK_KERNEL     = 3,  // a kernel answering the host through mapped memory (best of a few)
};

// A device time and a host time taken at the same instant, within +-max_deviation_ns.
struct ggml_gpu_clock_pair {
    uint64_t device_time;    // the device's clock: ticks (Vulkan: times the profiler's period_ns), or ns (CUDA)
    int64_t  host_ns;        // the host's clock (see `now`)
    int64_t  max_deviation_ns;
    int64_t  resolution_ns;  // the device clock's step as the pair saw it (0: not measured)
    int32_t  method;         // enum ggml_gpu_clock_method
};

// The method asked for (GGML_GPU_CLOCK_ANY: the best there is), on the host clock `now` (ns; NULL:
// CLOCK_MONOTONIC, which GGML_GPU_CLOCK_CALIBRATED reads itself: with `now` set, that method is not
// used). Best called with the backend idle (synchronized). 0 = ok, -1 = the method is not available
// or gave no answer.
typedef int (*ggml_backend_gpu_clock_pair_t)(ggml_backend_t backend,
                                             int32_t        method,
                                             int64_t (*now)(void),
                                             struct ggml_gpu_clock_pair * pair);

#ifdef __cplusplus
}
#endif
