#include "llama-instr-timing.h"

#include "ggml-backend-instr.h"
#include "ggml-backend.h"
#include "ggml-gpu-marks-instr.h"
#include "llama-context.h"
#include "llama-instr-env.h"
#include "llama-instr-hooks.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>

using namespace llama_instr;

std::atomic<bool> llama_instr::g_llama_instr_defer_steps{ false };
std::atomic<bool> llama_instr::g_llama_instr_test_async{ false };

void llama_instr::synchronize_backends(llama_context * ctx) {
    ggml_backend_sched_synchronize(ctx->get_sched());
}

namespace {

// a compute's entries of p_ops (or p_layers): what its timers collected, then what they finished
template <typename F> void for_each_op(const compute_rec & c, F && f) {
    for (size_t k = c.op_begin; k < c.op_end; k++) {
        f(k);
    }
    for (size_t k = c.late_op_begin; k < c.late_op_end; k++) {
        f(k);
    }
}

template <typename F> void for_each_layer(const compute_rec & c, F && f) {
    for (size_t k = c.layer_begin; k < c.layer_end; k++) {
        f(k);
    }
    for (size_t k = c.late_layer_begin; k < c.late_layer_end; k++) {
        f(k);
    }
}

// [layer, start_off, dur, n_ops] per layer span, and the device as a fifth element where it is not
// the CPU backend's
void write_layers(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("layers");
    j.ch('[');
    for_each_layer(c, [&](size_t k) {
        const layer_rec & l = st.p_layers[k];
        j.sep();
        j.ch('[');
        j.i64s({ l.layer, l.t_start - c.t_start, l.t_end - l.t_start, l.n_ops });
        if (l.device != st.cpu_device) {
            j.ch(',');
            j.i64(l.device);
        }
        j.ch(']');
    });
    j.ch(']');
}

void write_ops(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("ops");
    j.ch('[');
    json_rows r{ j };
    for_each_op(c, [&](size_t k) {
        const op_rec & op = st.p_ops[k];
        r.row();
        r.i64(op.idx);
        r.ch(',');
        r.i64(op.t_start - c.t_start);
        r.ch(',');
        r.i64(op.t_end - op.t_start);
        if (op.n_fused > 0) {
            r.ch(',');
            r.ch('[');
            for (int32_t f = 1; f <= op.n_fused; f++) {
                if (f > 1) {
                    r.ch(',');
                }
                r.i64(op.idx + f);  // fused nodes follow the first one in the graph
            }
            r.ch(']');
        }
        r.ch(']');
    });
    r.ch(']');
    r.flush();
}

// [device, i_start, i_end, start_off, launch_off, end_off] per split
void write_splits(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("splits");
    j.ch('[');
    for (size_t k = c.split_begin; k < c.split_end; k++) {
        const split_rec & s = st.p_splits[k];
        j.sep();
        j.ch('[');
        j.i64s({ s.device, s.i_start, s.i_end, s.t_start - c.t_start, s.t_launch - c.t_start, s.t_end - c.t_start });
        j.ch(']');
    }
    j.ch(']');
}

// [device, start_off, dur, split, n_ops] per stretch of work a device timed itself (a Vulkan
// command buffer); only when some device did
void write_busy(json_out & j, const ctx_state & st, const compute_rec & c) {
    if (c.busy_begin == c.busy_end && c.late_busy_begin == c.late_busy_end) {
        return;
    }
    j.key("busy");
    j.ch('[');
    for (const auto & [a, b] : {
             std::pair{ c.busy_begin,      c.busy_end      },
             std::pair{ c.late_busy_begin, c.late_busy_end }
    }) {
        for (size_t k = a; k < b; k++) {
            const busy_rec & r = st.p_busy[k];
            j.sep();
            j.ch('[');
            j.i64s({ r.device, r.t_start - c.t_start, r.t_end - r.t_start, r.split, r.n_ops });
            j.ch(']');
        }
    }
    j.ch(']');
}

// [device, method, uncertainty] per device whose own clock timed this compute
void write_clocks(json_out & j, const ctx_state & st, const compute_rec & c) {
    if (c.clock_begin == c.clock_end && c.late_clock_begin == c.late_clock_end) {
        return;
    }
    j.key("clocks");
    j.ch('[');
    for (const auto & [a, b] : {
             std::pair{ c.clock_begin,      c.clock_end      },
             std::pair{ c.late_clock_begin, c.late_clock_end }
    }) {
        for (size_t k = a; k < b; k++) {
            const clock_rec & r = st.p_clocks[k];
            j.sep();
            j.ch('[');
            j.i64(r.device);
            j.ch(',');
            j.str(r.method == GGML_GPU_CLOCK_CALIBRATED ? "calibrated" :
                  r.method == GGML_GPU_CLOCK_KERNEL     ? "globaltimer" :
                                                          "fence");
            j.ch(',');
            j.i64(r.uncertainty);
            j.ch(']');
        }
    }
    j.ch(']');
}

// [split, node or -1, name, bytes, from device, to device, start_off, dur] per copy
void write_copies(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("copies");
    j.ch('[');
    for (size_t k = c.copy_begin; k < c.copy_end; k++) {
        const copy_rec & r = st.p_copies[k];
        j.sep();
        j.ch('[');
        j.i64s({ r.split, r.node });
        j.ch(',');
        j.str(r.name);
        j.ch(',');
        j.i64s({ r.bytes, r.from, r.to, r.t_start - c.t_start, r.t_end - r.t_start });
        j.ch(']');
    }
    j.ch(']');
}

// [split, device, send_off, reply_off, start_off, end_off, one_way, err, clock_offset, bytes, n_ops]
// per graph an RPC server computed and timed
void write_remote(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("remote");
    j.ch('[');
    for (size_t k = c.remote_begin; k < c.remote_end; k++) {
        const remote_rec & r = st.p_remote[k];
        j.sep();
        j.ch('[');
        j.i64s({ r.split, r.device, r.t_send - c.t_start, r.t_recv - c.t_start, r.t_start - c.t_start,
                 r.t_end - c.t_start, r.one_way, r.err, r.offset, r.bytes, (int64_t) r.n_ops });
        j.ch(']');
    }
    j.ch(']');
}

void write_threads(json_out & j, const ctx_state & st, const compute_rec & c) {
    j.key("threads");
    j.ch('[');
    json_rows r{ j };
    for_each_op(c, [&](size_t k) {
        // each compute has its own thread count (n_threads or n_threads_batch, by ubatch size); an op
        // no CPU worker ran has none
        const op_rec & op = st.p_ops[k];
        r.row();
        for (int32_t t = 0; op.thread_begin >= 0 && t < c.n_threads; t++) {
            if (t) {
                r.ch(',');
            }
            r.i64(std::max<int64_t>(0, st.p_threads[op.thread_begin + t] - op.t_start));
        }
        r.ch(']');
    });
    r.ch(']');
    r.flush();
}

void write_tensor_stats(json_out & j, const ctx_state & st, const compute_rec & c) {
    record_head(j, "tensor_stats", c.t_end, st.sid);
    j.key("ctx");
    j.i64(st.id);
    j.key("step");
    j.i64(st.step);
    j.key("ubatch");
    j.i64(c.ubatch);
    j.key("graph");
    j.i64(c.graph_id);
    j.key("stats");
    j.ch('[');
    {
        json_rows out{ j };
        for (size_t k = c.stat_begin; k < c.stat_end; k++) {
            const stat_row & r = st.p_stats[k];
            out.row();
            out.i64(r.node);
            for (double v : { r.min, r.max, r.mean, r.std }) {
                out.ch(',');
                out.f32(v);  // statistics of float data
            }
            out.ch(',');
            out.i64(r.n_nan);
            out.ch(',');
            out.i64(r.n_inf);
            out.ch(']');
        }
        out.ch(']');
        out.flush();
    }
    j.ch('}');
}

// the op timers of sched's backends, made once (a context keeps its scheduler and backends)
void make_timers(ctx_state & st, ggml_backend_sched_t sched) {
    if (st.timers_sched == sched) {
        return;
    }
    st.timers.clear();
    st.cpu_device    = -1;
    st.async_devices = g_llama_instr_test_async.load(std::memory_order_relaxed);
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        st.timers.push_back({ make_op_timer(backend), false });
        if (strcmp(ggml_backend_name(backend), "CPU") == 0) {
            st.cpu_device = device_index(backend);
        }
        ggml_backend_dev_t dev  = ggml_backend_get_device(backend);
        const auto         type = dev ? ggml_backend_dev_type(dev) : GGML_BACKEND_DEVICE_TYPE_CPU;
        st.async_devices =
            st.async_devices || type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
    }
    st.timers_sched = sched;
}

void disarm_timers(ctx_state & st) noexcept {
    for (auto & slot : st.timers) {
        if (slot.armed) {
            slot.timer->disarm();
            slot.armed = false;
        }
    }
}

// what the op timers could only report at the step's end (op_timer::finish), compute by compute
void finish_timers(ctx_state & st) {
    for (compute_rec & c : st.p_computes) {
        c.late_op_begin    = st.p_ops.size();
        c.late_layer_begin = st.p_layers.size();
        c.late_busy_begin  = st.p_busy.size();
        c.late_clock_begin = st.p_clocks.size();
        c.remote_begin     = st.p_remote.size();
        int64_t n_lost     = 0;
        for (auto & slot : st.timers) {
            if (slot.timer) {
                n_lost += slot.timer->finish(st, c);
            }
        }
        c.late_op_end    = st.p_ops.size();
        c.late_layer_end = st.p_layers.size();
        c.late_busy_end  = st.p_busy.size();
        c.late_clock_end = st.p_clocks.size();
        c.remote_end     = st.p_remote.size();
        if (n_lost > 0) {
            count_compute(st, n_lost, 0);
        }
    }
}

}  // namespace

void llama_instr::write_step_computes(ctx_state & st) {
    finish_timers(st);
    json_out j{ st.line };
    if (st.tables_epoch != st.epoch || st.tables_file != st.file_index) {
        st.tables_written.clear();
        st.tables_epoch = st.epoch;
        st.tables_file  = st.file_index;
    }
    for (size_t i = 0; i < st.n_tables; i++) {
        st.tables_written.write(*st.tables[i].table, st.tables[i].head, j, st.sid, st.id);
        emit(st.epoch, st.line);
        st.tables[i].table.reset();
    }
    st.n_tables = 0;
    for (const compute_rec & c : st.p_computes) {
        record_head(j, "compute", c.t_end, st.sid);
        j.key("ctx");
        j.i64(st.id);
        j.key("step");
        j.i64(st.step);
        j.key("ubatch");
        j.i64(c.ubatch);
        j.key("graph");
        j.i64(c.graph_id);
        j.key("t_start");
        j.i64(c.t_start);
        j.key("dur");
        j.i64(c.t_end > c.t_start ? c.t_end - c.t_start : 0);
        j.key("n_tokens");
        j.i64(c.n_tokens);
        j.key("status");
        j.i64(c.status);
        j.key("n_threads");
        j.i64(c.n_threads);
        j.key("wait");
        j.i64(c.t_synced > c.t_end ? c.t_synced - c.t_end : 0);
        write_splits(j, st, c);
        write_copies(j, st, c);
        write_busy(j, st, c);
        write_clocks(j, st, c);
        write_layers(j, st, c);
        if (c.remote_end > c.remote_begin) {
            write_remote(j, st, c);
        }
        if (st.level >= LLAMA_INSTR_LEVEL_DETAILED) {
            write_ops(j, st, c);
        }
        if (st.level >= LLAMA_INSTR_LEVEL_VERBOSE && !st.p_threads.empty()) {
            write_threads(j, st, c);
        }
        j.ch('}');
        emit(st.epoch, st.line);
        if (st.level >= LLAMA_INSTR_LEVEL_VERBOSE && env_device(st.epoch).value_stats) {
            write_tensor_stats(j, st, c);
            emit(st.epoch, st.line);
        }
        if (c.expert_end > c.expert_begin) {
            write_experts(j, st.experts, st.sid, st.id, st.step, c.ubatch, c.graph_id, c.t_end, c.expert_begin,
                          c.expert_end, c.etok_begin, c.etok_end, c.expert_read_dur);
            emit(st.epoch, st.line);
        }
    }
    clear_step_rows(st);
}

void llama_instr::clear_step_rows(ctx_state & st) noexcept {
    for (size_t i = 0; i < st.n_tables; i++) {
        st.tables[i].table.reset();
    }
    st.n_tables = 0;
    st.experts.clear_step();
    st.p_ops.clear();
    st.p_layers.clear();
    st.p_busy.clear();
    st.p_clocks.clear();
    st.p_threads.clear();
    st.p_stats.clear();
    st.p_splits.clear();
    st.p_copies.clear();
    st.p_remote.clear();
    st.p_computes.clear();
}

// The graphs indexed under another scheduler are dropped: llama.cpp makes a new one whenever it
// reserves its graphs again (after set_adapters_lora, set_adapter_cvec, set_sampler), freeing the
// copies the old one made of sources, and the graphs it built with them.
static void forget_graphs_of_other_scheds(ctx_state & st, ggml_backend_sched_t sched) {
    if (st.graphs_sched == sched) {
        return;
    }
    st.graphs_kept.clear();
    st.graph.gf          = nullptr;
    st.graph.n_nodes     = 0;
    st.graph.shape       = 0;
    st.graph.shape_split = 0;
    st.graph_captured.reset();
    st.graphs_sched = sched;
}

// st.graph := gf (whose fingerprint is `shape`), indexed: the graph kept that gf is built again
// the same, else indexed now. The graph indexed until now is kept in the slot it leaves (or the
// least recently used one). `built`: gf was just built (llama_instr_graph_built), not yet split.
static void index_graph(ctx_state & st, const ggml_cgraph * gf, uint64_t shape, const llama_model * model, bool built) {
    ctx_state::kept_graph * slot = nullptr;
    for (auto & k : st.graphs_kept) {
        if (k.index.same_as(gf, shape)) {
            slot = &k;
            break;
        }
    }
    const bool hit = slot != nullptr;
    if (!hit) {
        if (st.graphs_kept.size() < ctx_state::GRAPHS_KEPT) {
            slot = &st.graphs_kept.emplace_back();
        } else {
            slot = &*std::min_element(st.graphs_kept.begin(), st.graphs_kept.end(),
                                      [](const auto & a, const auto & b) { return a.used < b.used; });
        }
    }
    std::swap(st.graph.il_of, slot->index.il_of);  // the callback's layer ids are of gf
    std::swap(st.graph, slot->index);
    std::swap(st.graph_captured, slot->table);
    slot->used = st.graph_gen;
    if (!hit) {
        st.graph_captured.reset();
        st.graph.build(gf, model, st.encoder ? st.encoder->n_layer : INT32_MIN);
    } else if (built) {
        // as built, the sources are the model's own (the scheduler has not put its copies in yet)
        st.graph.take_sources(gf);
    }
    st.graph.il_of.clear();
}

//
// hooks
//

void llama_instr_graph_build_begin(llama_context * ctx) {
    ctx_state * st = ctx_get(ctx);
    if (st) {
        st->graph.il_of.clear();
    }
}

void llama_instr_graph_cb(llama_context * ctx, ggml_tensor * cur, int il) {
    ctx_state * st = ctx_get(ctx);
    if (!st) {
        return;
    }
    try {
        st->graph.il_of.emplace_back(cur, il);
    } catch (...) {
        hook_failed(st->epoch, "llama_instr_graph_cb");
    }
}

void llama_instr::graph_built(ctx_state & st, ggml_backend_sched_t sched, ggml_cgraph * gf, const llama_model * model) {
    try {
        forget_graphs_of_other_scheds(st, sched);
        index_graph(st, gf, graph_fingerprint(gf), model, true);
        st.graph_id      = next_graph_id(st);
        st.graph_emitted = false;
        st.graph_fresh   = true;
        st.graph_gen++;
    } catch (...) {
        st.graph.gf    = nullptr;
        st.graph_fresh = false;
        hook_failed(st.epoch, "llama_instr_graph_built");
    }
}

void llama_instr_graph_built(llama_context * ctx, ggml_cgraph * gf) {
    ctx_state * st = ctx_get(ctx);
    if (st) {
        graph_built(*st, ctx->get_sched(), gf, &ctx->get_model());
    }
}

void llama_instr_ubatch_begin(llama_context * ctx, int32_t n_tokens) {
    ctx_state * st = ctx_get(ctx);
    if (st) {
        st->ubatch_tokens = n_tokens;
    }
}

void llama_instr_compute_begin(llama_context *      ctx,
                               ggml_backend_t       backend_cpu,
                               ggml_backend_sched_t sched,
                               ggml_cgraph *        gf) {
    GGML_UNUSED(backend_cpu);  // timed as one of the scheduler's backends
    ctx_state * stp = ctx_get(ctx);
    if (!stp || !stp->in_decode || !sched) {
        if (stp) {
            stp->reused_seen = -1;  // a compute not seen: the next one's graph is checked
        }
        return;
    }
    compute_begin(*stp, ctx, sched, gf, &ctx->get_model(), ctx->perf_get_data().n_reused);
}

void llama_instr::compute_begin(ctx_state &           st,
                                const llama_context * ctx,
                                ggml_backend_sched_t  sched,
                                ggml_cgraph *         gf,
                                const llama_model *   model,
                                int32_t               n_reused) {
    st.t_compute_begin = now_ns();
    // the ubatch's own token count (0 for a compute that is no ubatch's, e.g. a K-shift)
    st.n_tokens        = st.ubatch_tokens;
    st.ubatch_tokens   = 0;
    try {
        forget_graphs_of_other_scheds(st, sched);
        // A graph indexed by llama_instr_graph_built for this compute is the one computed. Any
        // other (reused from an earlier decode, built before this session or while recording was
        // paused, or no ubatch's graph at all) is checked: llama.cpp rebuilds graphs in the same
        // memory. If it is not the graph indexed, index it as it is now (without the graph
        // callback's layer ids). The check (a pass over every node, about 15 us of a SmolLM2
        // generation step, its tensors cold after the last compute) is skipped when llama.cpp
        // counts exactly one reuse of its graph since the last compute, which this state saw
        // with the hooks on throughout: that graph, unchanged, is the one indexed (an encoder's
        // graph, built for each encode, has no such count: n_reused -1).
        const uint64_t changes = llama_instr_level_changes_seen();
        const bool     reused  = st.graph.gf == gf && n_reused >= 0 && st.reused_seen >= 0 &&
                            n_reused == st.reused_seen + 1 && changes == st.level_changes;
        st.reused_seen   = n_reused;
        st.level_changes = changes;
        if (st.graph_fresh && st.graph.gf == gf) {
            // indexed before the scheduler split it: a backend may have reordered its nodes since
            if (st.graph.follow_order(gf)) {
                st.graph_gen++;
                st.graph_captured.reset();  // its nodes are in another order
            }
        } else if (!reused) {
            const uint64_t shape = graph_fingerprint(gf);  // (once: index_graph looks it up too)
            if (!st.graph.same_as(gf, shape)) {
                index_graph(st, gf, shape, model, false);
                st.graph_gen++;
                st.graph_id = 0;
            }
        }
        st.graph_fresh = false;
        if (st.graph_id == 0) {
            st.graph_id      = next_graph_id(st);
            st.graph_emitted = false;
        }

        // the scheduler's splits (the graph is split already) and the copies of their inputs: at
        // most one per node or leaf of the graph
        const size_t n_splits = (size_t) std::max(1, ggml_backend_sched_get_n_splits(sched));
        const size_t n_copies = 2 * (size_t) ggml_graph_n_nodes(gf) + 64;
        if (st.sched_splits.size() < n_splits) {
            st.sched_splits.resize(n_splits);
        }
        if (st.sched_copies.size() < n_copies) {
            st.sched_copies.resize(n_copies);
        }
        st.sched_prof            = {};
        st.sched_prof.splits     = st.sched_splits.data();
        st.sched_prof.cap_splits = (int32_t) st.sched_splits.size();
        st.sched_prof.copies     = st.sched_copies.data();
        st.sched_prof.cap_copies = (int32_t) st.sched_copies.size();
        ggml_backend_sched_set_profiler(sched, &st.sched_prof);
        st.sched_profiling = true;

        // every backend's op timer
        make_timers(st, sched);
        for (auto & slot : st.timers) {
            slot.armed = slot.timer && slot.timer->arm(st, ctx, gf);
        }
    } catch (...) {
        // no index half built, nor one that may not be this graph's, is used by a later compute
        st.graph.gf    = nullptr;
        st.graph_fresh = false;
        st.reused_seen = -1;
        disarm_timers(st);
        hook_failed(st.epoch, "llama_instr_compute_begin");
    }
}

void llama_instr_compute_end(llama_context *      ctx,
                             ggml_backend_t       backend_cpu,
                             ggml_backend_sched_t sched,
                             ggml_cgraph *        gf,
                             int32_t              status) {
    GGML_UNUSED(backend_cpu);
    GGML_UNUSED(gf);
    ctx_state * stp = ctx_get(ctx);
    if (stp && stp->sched_profiling) {
        compute_end(*stp, sched, status);
    }
}

// The compute's end on the devices: the backends are synchronized when a timer needs them to be
// (and at VERBOSE, whose step writes its top-k logits and value statistics at its end); else the
// step's records wait for the host's own synchronization (st.device_pending). Every profiler is
// taken off. Returns when the compute's work is known done, or as far as the host waited.
static int64_t end_on_devices(ctx_state & st, ggml_backend_sched_t sched) {
    bool sync = st.level >= LLAMA_INSTR_LEVEL_VERBOSE;
    for (const auto & slot : st.timers) {
        sync = sync || (slot.armed && slot.timer->needs_sync());
    }
    if (sync) {
        ggml_backend_sched_synchronize(sched);
    }
    for (const auto & slot : st.timers) {
        st.device_pending = st.device_pending || (!sync && slot.armed && slot.timer->reads_later());
    }
    // a device that may still run the compute's work (no timer synchronized it: untimed, or its
    // timer not armed): the step's records wait for the host's own synchronization too, so that
    // `wait` runs to it
    st.device_pending      = st.device_pending || (!sync && st.async_devices);
    st.device_pending      = st.device_pending || g_llama_instr_defer_steps.load(std::memory_order_relaxed);
    const int64_t t_synced = now_ns();
    ggml_backend_sched_set_profiler(sched, nullptr);
    st.sched_profiling = false;
    // the backends are synchronized: take every profiler off before reading any
    for (auto & slot : st.timers) {
        if (slot.armed) {
            slot.timer->disarm();
        }
    }
    return t_synced;
}

// DETAILED: the node table of the compute's graph, captured while the graph exists (a later
// ubatch may rebuild it) and formatted after the step, once a file
static void queue_graph_table(ctx_state & st) {
    if (st.level < LLAMA_INSTR_LEVEL_DETAILED || st.graph_emitted) {
        return;
    }
    const int64_t ts = now_ns();
    if (!st.graph_captured) {
        st.graph_captured = std::make_shared<graph_table>();
        st.graph_captured->capture(st.graph);
    }
    if (st.tables.size() <= st.n_tables) {
        st.tables.resize(st.n_tables + 1);
    }
    auto & pending   = st.tables[st.n_tables++];
    pending.table    = st.graph_captured;
    pending.head     = { st.graph_id, st.n_tokens, ts };
    st.graph_emitted = true;
}

// The scheduler's splits and copies, on the devices of session_start.devices, into the step's rows
// (c's ranges of them): the ones past the profiler's room are lost, counted.
static int64_t take_sched_rows(ctx_state & st, ggml_backend_sched_t sched, compute_rec & c) {
    const ggml_backend_sched_profiler & sp       = st.sched_prof;
    const int32_t                       n_splits = std::min(sp.n_splits, sp.cap_splits);
    const int32_t                       n_copies = std::min(sp.n_copies, sp.cap_copies);
    c.split_begin                                = st.p_splits.size();
    c.copy_begin                                 = st.p_copies.size();
    for (int32_t i = 0; i < n_splits; i++) {
        const ggml_backend_sched_profile_split & s = sp.splits[i];
        st.p_splits.push_back({ device_index(ggml_backend_sched_get_backend(sched, s.backend_id)), s.i_start, s.i_end,
                                s.t_start, s.t_launch, s.t_end });
    }
    for (int32_t i = 0; i < n_copies; i++) {
        const ggml_backend_sched_profile_copy & q = sp.copies[i];
        copy_rec                                r = {};
        r.split                                   = q.split;
        r.node                                    = st.graph.find(q.tensor);
        copy_name(r.name, q.tensor ? q.tensor->name : "");
        r.from    = device_index(ggml_backend_sched_get_backend(sched, q.from_backend_id));
        r.to      = device_index(ggml_backend_sched_get_backend(sched, q.to_backend_id));
        r.bytes   = q.bytes;
        r.t_start = q.t_start;
        r.t_end   = q.t_end;
        st.p_copies.push_back(r);
    }
    c.split_end = st.p_splits.size();
    c.copy_end  = st.p_copies.size();
    return (sp.n_splits - n_splits) + (sp.n_copies - n_copies);
}

void llama_instr::compute_end(ctx_state & st, ggml_backend_sched_t sched, int32_t status) {
    const int64_t t_synced = end_on_devices(st, sched);
    try {
        queue_graph_table(st);

        compute_rec c = {};
        c.ubatch      = st.ubatch;
        c.graph_id    = st.graph_id;
        c.n_tokens    = st.n_tokens;
        c.status      = status;
        c.op_begin    = st.p_ops.size();
        c.layer_begin = st.p_layers.size();
        c.busy_begin  = st.p_busy.size();
        c.clock_begin = st.p_clocks.size();
        c.stat_begin  = st.p_stats.size();
        c.t_synced    = t_synced;

        c.expert_begin    = st.experts.p_rows.size();
        c.etok_begin      = st.experts.p_tok.size();
        c.expert_read_dur = -1;

        int64_t n_lost = take_sched_rows(st, sched, c);

        // from the first split's start to the last one's return (without splits, the host's),
        // widened by each timer to the ops it measured
        const ggml_backend_sched_profiler & sp       = st.sched_prof;
        const int32_t                       n_splits = std::min(sp.n_splits, sp.cap_splits);
        c.t_start                                    = n_splits > 0 ? sp.splits[0].t_start : st.t_compute_begin;
        c.t_end                                      = n_splits > 0 ? sp.splits[n_splits - 1].t_end : t_synced;
        for (auto & slot : st.timers) {
            if (slot.armed) {
                slot.armed = false;
                n_lost += slot.timer->collect(st, c);
            }
        }
        c.op_end    = st.p_ops.size();
        c.layer_end = st.p_layers.size();
        c.busy_end  = st.p_busy.size();
        c.clock_end = st.p_clocks.size();
        c.stat_end  = st.p_stats.size();

        c.expert_end = st.experts.p_rows.size();
        c.etok_end   = st.experts.p_tok.size();
        st.p_computes.push_back(c);
        st.ubatch++;
        count_compute(st, n_lost);

    } catch (...) {
        for (auto & slot : st.timers) {
            slot.armed = false;
        }
        hook_failed(st.epoch, "llama_instr_compute_end");
    }
}
