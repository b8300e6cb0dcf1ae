// llamacpp-instr device timing for ggml-vulkan (ggml-vulkan-instr.h, instr.h): the marks and reads
// recorded into the compute command buffers, the profiler's proc addresses, and the clock pair.

#include "instr.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <new>

vk_instr_prof::~vk_instr_prof() {
    if (pool) {
        dev.destroyQueryPool(pool);
    }
    if (pair_pool) {
        dev.destroyQueryPool(pair_pool);
    }
    if (pair_fence) {
        dev.destroyFence(pair_fence);
    }
}

void ggml_vk_instr_free(vk_instr_prof * st) {
    delete st;
}

// the backend context's state, made at its first use; null if there is no memory for it
static vk_instr_prof * ggml_vk_instr_state(ggml_backend_vk_context * ctx) {
    if (!ctx->instr_prof) {
        ctx->instr_prof = new (std::nothrow) vk_instr_prof();
    }
    return ctx->instr_prof;
}

bool ggml_vk_instr_calibrated_timestamps(const vk_device &                            device,
                                         const std::vector<vk::ExtensionProperties> & ext_props,
                                         std::vector<const char *> &                  extensions) {
    bool calibrated_timestamps = false;
#ifndef _WIN32
    for (const auto & properties : ext_props) {
        auto pfn_domains = (PFN_vkGetPhysicalDeviceCalibrateableTimeDomainsEXT) vkGetInstanceProcAddr(
            vk_instance.instance, "vkGetPhysicalDeviceCalibrateableTimeDomainsEXT");
        uint32_t n_domains = 0;
        if (strcmp(VK_EXT_CALIBRATED_TIMESTAMPS_EXTENSION_NAME, properties.extensionName) != 0 || !pfn_domains ||
            pfn_domains(device->physical_device, &n_domains, nullptr) != VK_SUCCESS) {
            continue;
        }
        std::vector<VkTimeDomainEXT> domains(n_domains);
        pfn_domains(device->physical_device, &n_domains, domains.data());
        calibrated_timestamps = std::count(domains.begin(), domains.end(), VK_TIME_DOMAIN_DEVICE_EXT) &&
                                std::count(domains.begin(), domains.end(), VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT);
    }
    if (calibrated_timestamps) {
        extensions.push_back(VK_EXT_CALIBRATED_TIMESTAMPS_EXTENSION_NAME);
    }
#else
    GGML_UNUSED(device);
    GGML_UNUSED(ext_props);
    GGML_UNUSED(extensions);
#endif
    return calibrated_timestamps;
}

void ggml_vk_instr_device_init(vk_device & device, bool calibrated_timestamps) {
    if (calibrated_timestamps) {
        device->pfn_vkGetCalibratedTimestampsEXT =
            (PFN_vkGetCalibratedTimestampsEXT) vkGetDeviceProcAddr(device->device, "vkGetCalibratedTimestampsEXT");
    }
}

// a timestamp query into the command buffer being recorded
static void ggml_vk_instr_mark(vk_instr_prof &     st,
                               vk_context_struct * subctx,
                               int32_t             kind,
                               const ggml_tensor * node,
                               int32_t             n_fused) {
    ggml_vk_profiler * p = st.p;
    if (kind == GGML_VK_PROFILE_CMDBUF_BEGIN) {
        st.buf     = subctx->s->buffer;
        st.buf_use = subctx->s->buffer->use_counter;
        st.n_cmdbufs++;
        st.n_ops     = 0;
        st.ops_begun = false;
        st.last_node = nullptr;
    }
    if (kind == GGML_VK_PROFILE_OPS_BEGIN) {
        st.ops_begun = true;
    }
    if (p->n_marks >= p->cap) {
        p->n_lost++;
        return;
    }
    ggml_vk_profile_mark & m = p->marks[p->n_marks];
    m.node                   = node;
    m.n_fused                = n_fused;
    m.kind                   = kind;
    m.n_ops                  = kind == GGML_VK_PROFILE_READ ? 0 : st.n_ops;  // (a read is no op)
    st.n_ops                 = kind == GGML_VK_PROFILE_READ ? st.n_ops : 0;
    m.cmdbuf                 = st.n_cmdbufs - 1;
    m.valid                  = 0;
    m.t                      = 0;
    subctx->s->buffer->buf.writeTimestamp(vk::PipelineStageFlagBits::eAllCommands, st.pool, (uint32_t) p->n_marks++);
}

// the read an op asks for (ggml_vk_profiler::read), after the op's commands: its rows' block is
// put aside in the readback buffer, to be copied behind the next barrier
static void ggml_vk_instr_read(ggml_backend_vk_context * ctx, ggml_tensor * const * nodes, int32_t n_nodes) {
    vk_instr_prof &     st        = *ctx->instr_prof;
    ggml_vk_profiler *  p         = st.p;
    size_t              row_bytes = 0;
    const ggml_tensor * t         = p->read(p->user, nodes, n_nodes, &row_bytes);
    if (!t) {
        return;
    }
    const int64_t n_rows = t->ne[1];
    // from the first row's start to the end of the last row's row_bytes, rows nb[1] apart
    const size_t  bytes  = n_rows > 0 ? (size_t) (n_rows - 1) * t->nb[1] + row_bytes : 0;
    if (!t->buffer || !ggml_backend_buffer_is_vk(t->buffer) || t->ne[2] != 1 || t->ne[3] != 1 || n_rows <= 0 ||
        n_rows > INT32_MAX || row_bytes == 0 || row_bytes > t->nb[1] || !st.readback ||
        st.pending.size() >= st.pending.capacity() || p->n_reads + (int64_t) st.pending.size() >= p->reads_cap ||
        p->readback_used + bytes > std::min(p->readback_cap, st.readback->size)) {
        p->n_reads_lost++;
        return;
    }
    vk_buffer buf    = nullptr;
    size_t    offset = 0;
    if (ctx->device->uma) {
        ggml_vk_host_get(ctx->device, t->data, buf, offset);
    }
    if (!buf) {
        buf    = ((ggml_backend_vk_buffer_context *) t->buffer->context)->dev_buffer;
        offset = vk_tensor_offset(t) + t->view_offs;
    }
    st.pending.push_back({ t, buf, offset, p->readback_used, bytes, row_bytes, t->nb[1], (int32_t) n_rows });
    p->readback_used += bytes;
}

// the reads put aside, each copied in one command behind the barrier just recorded (ggml-vulkan's
// own before a node that depends on unsynchronized writes, or at the end of a command buffer,
// ours) and followed by a READ mark, which times the copy and says it ran. A read with no mark
// left is not copied. Every read's source joins the backend's unsynchronized reads: a later write
// of that memory waits for the copy. True if any was copied.
static bool ggml_vk_instr_flush_reads(vk_instr_prof & st, vk_context_struct * subctx) {
    ggml_vk_profiler * p = st.p;
    if (!p || st.pending.empty()) {
        return false;
    }
    bool copied = false;
    for (const vk_instr_read & r : st.pending) {
        if (p->n_marks >= p->cap || p->n_reads >= p->reads_cap) {
            p->n_reads_lost++;
            continue;
        }
        subctx->s->buffer->buf.copyBuffer(r.buf->buffer, st.readback->buffer, vk::BufferCopy(r.offset, r.dst, r.bytes));
        p->reads[p->n_reads++] = { r.t, r.dst, r.row_bytes, r.row_stride, r.n_rows, p->n_marks };
        ggml_vk_instr_mark(st, subctx, GGML_VK_PROFILE_READ, r.t, 0);
        if (st.unsynced_read) {
            st.unsynced_read->push_back(r.t);
        }
        copied = true;
    }
    st.pending.clear();
    return copied;
}

// is the command buffer being recorded the one marked last (a buffer is reused once submitted)?
static bool ggml_vk_instr_marked(const vk_instr_prof & st, const vk_context_struct * subctx) {
    return st.buf == subctx->s->buffer && st.buf_use == subctx->s->buffer->use_counter;
}

void ggml_vk_instr_ctx_begin(vk_context_struct * subctx) {
    ggml_vk_instr_mark(*subctx->prof, subctx, GGML_VK_PROFILE_CMDBUF_BEGIN, nullptr, 0);
}

void ggml_vk_instr_ctx_end(vk_context & subctx) {
    vk_instr_prof & st = *subctx->prof;
    if (!st.pending.empty()) {
        ggml_vk_sync_buffers(nullptr, subctx);  // reads not copied yet: behind a barrier of their own
        ggml_vk_instr_flush_reads(st, subctx.get());
    }
    if (ggml_vk_instr_marked(st, subctx.get())) {
        ggml_vk_instr_mark(st, subctx.get(), GGML_VK_PROFILE_CMDBUF_END, st.last_node, st.last_n_fused);
    }
}

void ggml_vk_instr_graph_begin(ggml_backend_vk_context * ctx, vk_context_struct * compute_ctx) {
    vk_instr_prof & st = *ctx->instr_prof;
    compute_ctx->prof  = &st;  // (a compute context made before the backend had a profiler's state)
    if (!ggml_vk_instr_marked(st, compute_ctx)) {
        // a compute context begun before the profiler was set
        ggml_vk_instr_mark(st, compute_ctx, GGML_VK_PROFILE_CMDBUF_BEGIN, nullptr, 0);
    }
    if (!st.ops_begun) {
        ggml_vk_instr_mark(st, compute_ctx, GGML_VK_PROFILE_OPS_BEGIN, nullptr, 0);
    }
}

// the test ggml_vk_build_graph makes of a node against the unsynchronized ones: the same device
// buffer, and byte ranges that overlap
static bool ggml_vk_instr_overlap(const ggml_tensor * a, const ggml_tensor * b) {
    const vk_buffer & a_buf = ((ggml_backend_vk_buffer_context *) a->buffer->context)->dev_buffer;
    const vk_buffer & b_buf = ((ggml_backend_vk_buffer_context *) b->buffer->context)->dev_buffer;
    if (a_buf != b_buf) {
        return false;
    }
    const uint64_t a_base = vk_tensor_offset(a) + a->view_offs;
    const uint64_t a_size = ggml_nbytes(a);
    const uint64_t b_base = vk_tensor_offset(b) + b->view_offs;
    const uint64_t b_size = ggml_nbytes(b);
    return (b_base <= a_base && a_base < b_base + b_size) || (a_base <= b_base && b_base < a_base + a_size);
}

void ggml_vk_instr_barrier(ggml_backend_vk_context * ctx,
                           vk_context &              compute_ctx,
                           const ggml_cgraph *       cgraph,
                           int                       node_idx) {
    if (!ggml_vk_instr_flush_reads(*ctx->instr_prof, compute_ctx.get())) {
        return;
    }
    // the backend's unsynchronized reads are those copies now (the barrier cleared the list)
    for (int32_t i = 0; i <= ctx->num_additional_fused_ops; ++i) {
        if ((ctx->fused_ops_write_mask & (1 << i)) == 0) {
            continue;
        }
        const ggml_tensor * node = cgraph->nodes[node_idx + i];
        for (const ggml_tensor * read : ctx->unsynced_nodes_read) {
            if (ggml_vk_instr_overlap(node, read)) {
                ggml_vk_sync_buffers(ctx, compute_ctx);
                ctx->unsynced_nodes_read.clear();
                return;
            }
        }
    }
}

void ggml_vk_instr_op(ggml_backend_vk_context * ctx,
                      vk_context_struct *       compute_ctx,
                      ggml_cgraph *             cgraph,
                      int                       node_idx,
                      bool                      always) {
    vk_instr_prof &    st      = *ctx->instr_prof;
    ggml_vk_profiler * p       = st.p;
    ggml_tensor *      node    = cgraph->nodes[node_idx];
    const int          n_fused = ctx->num_additional_fused_ops;
    st.n_ops++;
    st.last_node    = node;
    st.last_n_fused = n_fused;
    if (always || !p->want || p->want(p->user, node, cgraph->nodes[node_idx + n_fused])) {
        ggml_vk_instr_mark(st, compute_ctx, GGML_VK_PROFILE_OP, node, n_fused);
    }
    if (p->read) {
        ggml_vk_instr_read(ctx, &cgraph->nodes[node_idx], n_fused + 1);
    }
}

// the host clock a clock pair is on when the caller names none: CLOCK_MONOTONIC
static int64_t ggml_vk_instr_host_now() {
#ifdef _WIN32
    return ggml_time_us() * 1000;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

static int ggml_backend_vk_set_profiler(ggml_backend_t backend, ggml_vk_profiler * p) {
    ggml_backend_vk_context * ctx = (ggml_backend_vk_context *) backend->context;
    if (!ctx->instr_prof && !p) {
        return 0;
    }
    vk_instr_prof * state = ggml_vk_instr_state(ctx);
    if (!state) {
        return -1;
    }
    vk_instr_prof & st = *state;
    if (st.p) {
        st.n_used = std::max(st.n_used, (uint32_t) std::min(st.p->n_marks, st.p->cap));
    }
    if (st.p) {
        st.p->n_reads_lost += (int32_t) st.pending.size();  // (none: every buffer ended)
    }
    st.pending.clear();
    st.p = nullptr;
    if (!p) {
        return 0;
    }
    if (st.valid_bits < 0) {
        st.valid_bits = (int32_t) ctx->device->physical_device
                            .getQueueFamilyProperties()[ctx->device->compute_queue->queue_family_index]
                            .timestampValidBits;
    }
    if (st.valid_bits == 0 || p->cap <= 0) {
        return -1;
    }
    st.dev = ctx->device->device;
    if (st.pool_size < (uint32_t) p->cap) {
        if (st.pool) {
            st.dev.destroyQueryPool(st.pool);
        }
        vk::QueryPoolCreateInfo info;
        info.queryType  = vk::QueryType::eTimestamp;
        info.queryCount = (uint32_t) p->cap;
        st.pool         = st.dev.createQueryPool(info);
        st.pool_size    = info.queryCount;
        st.n_used       = st.pool_size;  // a new query is in no defined state until reset
    }
    if (st.n_used > 0) {
        st.dev.resetQueryPool(st.pool, 0, st.n_used);
        st.n_used = 0;
    }
    p->n_reads       = 0;
    p->n_reads_lost  = 0;
    p->readback_used = 0;
    st.pending.reserve(16);
    st.unsynced_read = &ctx->unsynced_nodes_read;
    if (p->read && p->readback_cap > 0 && (!st.readback || st.readback->size < p->readback_cap)) {
        try {
            st.readback = ggml_vk_create_buffer_check(
                ctx->device, p->readback_cap,
                vk::MemoryPropertyFlagBits::eHostVisible | vk::MemoryPropertyFlagBits::eHostCoherent |
                    vk::MemoryPropertyFlagBits::eHostCached,
                vk::MemoryPropertyFlagBits::eHostVisible | vk::MemoryPropertyFlagBits::eHostCoherent);
        } catch (const std::exception &) {
            st.readback = nullptr;  // no reads (each counted lost)
        }
    }
    p->n_marks    = 0;
    p->n_lost     = 0;
    p->period_ns  = ctx->device->properties.limits.timestampPeriod;
    p->valid_bits = st.valid_bits;
    st.buf        = nullptr;
    st.n_cmdbufs  = 0;
    st.p          = p;
    return 0;
}

static int ggml_backend_vk_profiler_collect(ggml_backend_t backend, ggml_vk_profiler * p, int32_t begin, int32_t end) {
    ggml_backend_vk_context * ctx = (ggml_backend_vk_context *) backend->context;
    begin                         = std::max(begin, 0);
    end                           = std::min({ end, p->n_marks, p->cap });
    if (end <= begin) {
        return 0;
    }
    if (!ctx->instr_prof) {
        return -1;
    }
    vk_instr_prof &         st  = *ctx->instr_prof;
    const int32_t           n   = end - begin;
    // each query's time and its availability (a mark in a command buffer never submitted has none)
    std::vector<uint64_t> & res = st.results;
    res.resize(2 * (size_t) n);
    const vk::Result ok = st.dev.getQueryPoolResults(
        st.pool, (uint32_t) begin, (uint32_t) n, res.size() * sizeof(uint64_t), res.data(), 2 * sizeof(uint64_t),
        vk::QueryResultFlagBits::e64 | vk::QueryResultFlagBits::eWithAvailability);
    if (ok != vk::Result::eSuccess && ok != vk::Result::eNotReady) {
        return -1;
    }
    const uint64_t mask = p->valid_bits >= 64 ? ~0ull : (1ull << p->valid_bits) - 1;
    for (int32_t k = 0; k < n; k++) {
        p->marks[begin + k].valid = res[2 * k + 1] != 0;
        p->marks[begin + k].t     = res[2 * k] & mask;
    }
    if (p->n_reads > 0 && st.readback && st.readback->ptr && p->readback) {
        // the bytes of the reads that ran (the command buffer of their READ mark executed)
        for (int32_t k = 0; k < p->n_reads; k++) {
            const ggml_vk_profile_read & r = p->reads[k];
            if (r.mark >= begin && r.mark < end && p->marks[r.mark].valid) {
                memcpy(p->readback + r.offset, (const uint8_t *) st.readback->ptr + r.offset,
                       (size_t) (r.n_rows - 1) * r.row_stride + r.row_bytes);
            }
        }
    }
    return 0;
}

static int ggml_backend_vk_clock_pair(ggml_backend_t backend,
                                      int32_t        method,
                                      int64_t (*now)(void),
                                      ggml_gpu_clock_pair * pair) {
    ggml_backend_vk_context * ctx    = (ggml_backend_vk_context *) backend->context;
    vk_device &               device = ctx->device;
#ifndef _WIN32
    // (the calibrated pair is on CLOCK_MONOTONIC: only when the caller names no other clock)
    if ((method == GGML_GPU_CLOCK_ANY || method == GGML_GPU_CLOCK_CALIBRATED) && !now &&
        device->pfn_vkGetCalibratedTimestampsEXT) {
        VkCalibratedTimestampInfoEXT info[2] = {};
        info[0].sType                        = VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT;
        info[0].timeDomain                   = VK_TIME_DOMAIN_DEVICE_EXT;
        info[1].sType                        = VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT;
        info[1].timeDomain                   = VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT;
        uint64_t ts[2]                       = {};
        uint64_t max_deviation               = 0;
        if (device->pfn_vkGetCalibratedTimestampsEXT(device->device, 2, info, ts, &max_deviation) == VK_SUCCESS) {
            pair->device_time      = ts[0];
            pair->host_ns          = (int64_t) ts[1];
            pair->max_deviation_ns = (int64_t) max_deviation;
            pair->resolution_ns    = 0;
            pair->method           = GGML_GPU_CLOCK_CALIBRATED;
            return 0;
        }
    }
#endif
    if (method != GGML_GPU_CLOCK_ANY && method != GGML_GPU_CLOCK_FENCE) {
        return -1;
    }
    if (!now) {
        now = ggml_vk_instr_host_now;
    }
    vk_instr_prof * state = ggml_vk_instr_state(ctx);
    if (!state) {
        return -1;
    }
    vk_instr_prof & st = *state;
    try {
        std::lock_guard<std::recursive_mutex> guard(device->mutex);
        st.dev = device->device;
        if (!st.pair_pool) {
            vk::QueryPoolCreateInfo info;
            info.queryType  = vk::QueryType::eTimestamp;
            info.queryCount = 1;
            st.pair_pool    = st.dev.createQueryPool(info);
            st.pair_fence   = st.dev.createFence({});
        }
        st.dev.resetQueryPool(st.pair_pool, 0, 1);
        vk_context subctx = ggml_vk_create_temporary_context(device->compute_queue->cmd_pool);
        ggml_vk_ctx_begin(device, subctx);
        subctx->s->buffer->buf.writeTimestamp(vk::PipelineStageFlagBits::eAllCommands, st.pair_pool, 0);
        ggml_vk_ctx_end(subctx);
        const int64_t t0 = now();
        ggml_vk_submit(subctx, st.pair_fence);
        VK_CHECK(st.dev.waitForFences({ st.pair_fence }, true, UINT64_MAX), "clock pair waitForFences", device);
        const int64_t t1 = now();
        st.dev.resetFences({ st.pair_fence });
        ggml_vk_queue_command_pools_cleanup(device);
        uint64_t t = 0;
        if (st.dev.getQueryPoolResults(st.pair_pool, 0, 1, sizeof(t), &t, sizeof(t),
                                       vk::QueryResultFlagBits::e64 | vk::QueryResultFlagBits::eWait) !=
            vk::Result::eSuccess) {
            return -1;
        }
        pair->device_time      = t;
        pair->host_ns          = t0 + (t1 - t0) / 2;
        pair->max_deviation_ns = (t1 - t0 + 1) / 2;
        pair->resolution_ns    = 0;
        pair->method           = GGML_GPU_CLOCK_FENCE;
        return 0;
    } catch (const std::exception &) {
        return -1;
    }
}

void * ggml_backend_vk_get_proc_address(ggml_backend_reg_t reg, const char * name) {
    GGML_UNUSED(reg);
    if (strcmp(name, "ggml_backend_vk_set_profiler") == 0) {
        return (void *) ggml_backend_vk_set_profiler;
    }
    if (strcmp(name, "ggml_backend_vk_profiler_collect") == 0) {
        return (void *) ggml_backend_vk_profiler_collect;
    }
    if (strcmp(name, "ggml_backend_vk_clock_pair") == 0) {
        return (void *) ggml_backend_vk_clock_pair;
    }
    return NULL;
}
