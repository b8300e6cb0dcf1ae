#pragma once

// llamacpp-instr device timing (ggml-vulkan-instr.h): timestamp queries written into the compute
// command buffers ggml-vulkan records anyway, and reads of ops' outputs copied behind its own
// barriers. ggml-vulkan.cpp calls the hooks below, each only while a profiler is set
// (ggml_vk_instr_on); the state is one vk_instr_prof per backend context, made at the first
// set_profiler or clock pair and freed with the context.

#include "ggml-vulkan-common.h"
#include "ggml-vulkan-instr.h"

#include <vector>

// a read put aside until the next barrier (ggml_vk_instr_op)
struct vk_instr_read {
    const ggml_tensor * t;
    vk_buffer           buf;  // where its rows are, from offset: bytes of them
    size_t              offset;
    size_t              dst;  // where they go in the readback buffer
    size_t              bytes;
    size_t              row_bytes;
    size_t              row_stride;
    int32_t             n_rows;
};

// device timing (struct ggml_vk_profiler), one per backend context
struct vk_instr_prof {
    ggml_vk_profiler *                 p{};              // set = on
    vk::Device                         dev;
    vk::QueryPool                      pool;             // one query per mark
    uint32_t                           pool_size{};
    uint32_t                           n_used{};         // queries to reset before the next use
    int32_t                            valid_bits = -1;  // of the compute queue's timestamps; -1 = not looked up
    std::vector<uint64_t>              results;
    vk_command_buffer *                buf{};            // the command buffer marked last, and its use
    uint64_t                           buf_use{};
    int32_t                            n_cmdbufs{};
    int32_t                            n_ops{};      // ops recorded since the last mark
    const ggml_tensor *                last_node{};  // the last op recorded into the buffer marked last
    int32_t                            last_n_fused{};
    bool                               ops_begun{};  // the buffer marked last has its OPS_BEGIN mark
    vk::QueryPool                      pair_pool;    // GGML_GPU_CLOCK_FENCE
    vk::Fence                          pair_fence;
    vk_buffer                          readback;     // host-visible: the reads' bytes (ggml_vk_profiler::read)
    std::vector<vk_instr_read>         pending;      // reads not copied yet (reserved: not allocated while recording)
    std::vector<const ggml_tensor *> * unsynced_read{};  // the backend's unsynced_nodes_read

    ~vk_instr_prof();
};

static inline bool ggml_vk_instr_on(const vk_instr_prof * st) {
    return st != nullptr && st->p != nullptr;
}

// the device's extensions: VK_EXT_calibrated_timestamps is enabled where the device has it with
// the host's CLOCK_MONOTONIC (true: it was added to `extensions`)
bool ggml_vk_instr_calibrated_timestamps(const vk_device &                            device,
                                         const std::vector<vk::ExtensionProperties> & ext_props,
                                         std::vector<const char *> &                  extensions);

// the device made, with VK_EXT_calibrated_timestamps enabled or not
void ggml_vk_instr_device_init(vk_device & device, bool calibrated_timestamps);

// a command buffer of a context with a profiler begins (CMDBUF_BEGIN), and ends: reads not
// copied yet are copied behind a barrier of their own, then the buffer's CMDBUF_END mark
void ggml_vk_instr_ctx_begin(vk_context_struct * subctx);
void ggml_vk_instr_ctx_end(vk_context & subctx);

// before node_idx of a graph compute is recorded into compute_ctx: the buffer's CMDBUF_BEGIN
// mark (a compute context begun before the profiler was set) and OPS_BEGIN mark, where missing
void ggml_vk_instr_graph_begin(ggml_backend_vk_context * ctx, vk_context_struct * compute_ctx);

// after build_graph recorded the barrier it needs before node_idx (and its fused nodes): the reads
// put aside are copied behind it; if the node writes where one copies from, another barrier
void ggml_vk_instr_barrier(ggml_backend_vk_context * ctx,
                           vk_context &              compute_ctx,
                           const ggml_cgraph *       cgraph,
                           int                       node_idx);

// after node_idx's commands (and those of the nodes fused into it): its OP mark where the
// profiler selects it (always where `always`: the last op of a compute or of a command buffer),
// and the read of its output it asks for
void ggml_vk_instr_op(ggml_backend_vk_context * ctx,
                      vk_context_struct *       compute_ctx,
                      ggml_cgraph *             cgraph,
                      int                       node_idx,
                      bool                      always);

void ggml_vk_instr_free(vk_instr_prof * st);

// the registry's proc addresses (ggml-vulkan-instr.h)
void * ggml_backend_vk_get_proc_address(ggml_backend_reg_t reg, const char * name);
