#include "llama-instr-rpc.h"

#include "llama-instr-json.h"
#include "llama-instr-session.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

using namespace llama_instr;

namespace {

// one command sent to an RPC server
struct transfer_row {
    int32_t      device;  // index into session_start.machine.devices, or -1
    const char * cmd;     // ggml-rpc's name of it (a string literal of the library)
    char         tensor[GGML_MAX_NAME];
    int64_t      bytes, sent, recv;
    int64_t      t_queue, t_start, t_sent, t_end;
    const void * owner;  // the owner of the step that issued it (rpc_set_owner), or nullptr
};

// the owner of the step this thread runs (rpc_set_owner), handed to ggml-rpc as each command is
// issued (ggml_rpc_profiler::owner)
thread_local const void * t_owner = nullptr;

const void * owner_of_thread(void * user) {
    (void) user;
    return t_owner;
}

// is a command (or graph) of `owner` one that the step of `step` takes? Its own, or one that no
// step claimed (issued outside a step's owned part, on a thread that set no owner)
bool takes(const void * owner, const void * step) {
    return owner == step || owner == nullptr;
}

// bounds, so that a recording nobody writes out (a program that never opens its session) stays small
constexpr size_t MAX_ROWS     = 1 << 18;
constexpr size_t MAX_GRAPHS   = 1 << 12;
constexpr size_t ROWS_PER_REC = 4096;

struct recorder {
    std::mutex mtx;

    // ggml-rpc's entry points, looked up once
    bool                                 looked_up     = false;
    ggml_backend_rpc_set_profiler_t      set_profiler  = nullptr;
    ggml_backend_rpc_dev_remote_timing_t remote_timing = nullptr;
    ggml_backend_rpc_profiler_sync_t     sync          = nullptr;

    ggml_rpc_profiler prof       = {};
    bool              load_on    = false;  // keeping commands for the next session
    bool              session_on = false;  // keeping them for the open session
    bool              stepped    = false;  // a step of the session has ended: later rows are not the load's

    std::vector<transfer_row> rows;
    int64_t                   dropped = 0;  // rows beyond MAX_ROWS
    std::vector<remote_graph> graphs;
};

// Never destroyed: ggml-rpc's threads may call it until the process ends.
recorder & R() {
    static recorder * r = new recorder();
    return *r;
}

int32_t dev_index(ggml_backend_dev_t dev) {
    for (size_t i = 0; dev && i < ggml_backend_dev_count(); i++) {
        if (ggml_backend_dev_get(i) == dev) {
            return (int32_t) i;
        }
    }
    return -1;
}

// a command without a device (allocating a buffer, ...): the first device of its server, whose
// description is the endpoint
int32_t endpoint_index(const char * endpoint) {
    for (size_t i = 0; endpoint && i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0 &&
            strcmp(ggml_backend_dev_description(dev), endpoint) == 0) {
            return (int32_t) i;
        }
    }
    return -1;
}

void on_transfer(void * user, const ggml_rpc_profile_transfer * t) {
    recorder &                  r = *(recorder *) user;
    std::lock_guard<std::mutex> lock(r.mtx);
    if (!r.load_on && !r.session_on) {
        return;  // a command that was under way when the recording stopped
    }
    if (r.rows.size() >= MAX_ROWS) {
        r.dropped++;
        return;
    }
    try {
        transfer_row row = {};
        row.device       = t->device ? dev_index(t->device) : endpoint_index(t->endpoint);
        row.cmd          = t->cmd;
        snprintf(row.tensor, sizeof(row.tensor), "%s", t->tensor ? t->tensor : "");
        row.bytes   = t->bytes;
        row.sent    = t->sent;
        row.recv    = t->recv;
        row.t_queue = t->t_queue;
        row.t_start = t->t_start;
        row.t_sent  = t->t_sent;
        row.t_end   = t->t_end;
        row.owner   = t->owner;
        r.rows.push_back(row);
    } catch (...) {
        r.dropped++;
    }
}

void on_graph(void * user, const ggml_rpc_profile_graph * g) {
    recorder &                  r = *(recorder *) user;
    std::lock_guard<std::mutex> lock(r.mtx);
    if (!r.session_on) {
        return;
    }
    try {
        if (r.graphs.size() >= MAX_GRAPHS) {
            r.graphs.erase(r.graphs.begin());  // nobody took it: no timer runs for its device
        }
        remote_graph rg = {};
        rg.device       = g->device ? dev_index(g->device) : endpoint_index(g->endpoint);
        rg.owner        = g->owner;
        rg.nodes        = g->nodes;
        rg.n_nodes      = g->n_nodes;
        rg.recompute    = g->recompute;
        rg.status       = g->status;
        rg.sent         = g->sent;
        rg.t_queue      = g->t_queue;
        rg.t_send       = g->t_send;
        rg.t_sent       = g->t_sent;
        rg.t_recv       = g->t_recv;
        rg.s_recv       = g->s_recv;
        rg.s_read       = g->s_read;
        rg.s_start      = g->s_start;
        rg.s_end        = g->s_end;
        rg.s_reply      = g->s_reply;
        rg.ops.assign(g->ops, g->ops + std::max(0, g->n_ops));
        r.graphs.push_back(std::move(rg));
    } catch (...) {
        // out of memory: this graph's ops are not timed
    }
}

// with r.mtx held
bool look_up(recorder & r) {
    if (!r.looked_up) {
        r.looked_up            = true;
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
        if (reg) {
            r.set_profiler = (ggml_backend_rpc_set_profiler_t) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_rpc_set_profiler");
            r.remote_timing = (ggml_backend_rpc_dev_remote_timing_t) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_rpc_dev_remote_timing");
            r.sync = (ggml_backend_rpc_profiler_sync_t) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_rpc_profiler_sync");
        }
        r.prof.on_transfer = on_transfer;
        r.prof.on_graph    = on_graph;
        r.prof.owner       = owner_of_thread;
        r.prof.user        = &r;
    }
    return r.set_profiler != nullptr;
}

// with r.mtx held: hand ggml-rpc the profiler (or take it back) as the recording needs
void install(recorder & r) {
    if (!look_up(r)) {
        return;
    }
    r.prof.remote_timing = r.session_on;
    r.set_profiler(r.load_on || r.session_on ? &r.prof : nullptr);
}

// `transfers` records of rows [b, e), at most ROWS_PER_REC rows each
void format_rows(const std::vector<transfer_row> & rows,
                 size_t                            b,
                 size_t                            e,
                 const std::string &               sid,
                 const char *                      phase,
                 int32_t                           ctx_id,
                 int64_t                           step,
                 int64_t                           dropped,
                 std::vector<std::string> &        lines) {
    // a record even without rows when some were dropped
    for (size_t c = b; c < e || (c == b && dropped > 0); c += ROWS_PER_REC) {
        const size_t ce = std::min(e, c + ROWS_PER_REC);
        int64_t      t0 = c < e ? rows[c].t_queue : now_ns(), t1 = c < e ? rows[c].t_end : t0;
        for (size_t k = c; k < ce; k++) {
            t0 = std::min(t0, rows[k].t_queue);
            t1 = std::max(t1, rows[k].t_end);
        }
        std::string line;
        json_out    j{ line };
        record_head(j, "transfers", t1, sid);
        j.key("phase");
        j.str(phase);
        if (step >= 0) {
            j.key("ctx");
            j.i64(ctx_id);
            j.key("step");
            j.i64(step);
        }
        if (dropped > 0 && c == b) {
            j.key("dropped");
            j.i64(dropped);
        }
        j.key("t_start");
        j.i64(t0);
        j.key("rows");
        j.ch('[');
        for (size_t k = c; k < ce; k++) {
            const transfer_row & row = rows[k];
            j.sep();
            j.ch('[');
            j.i64(row.device);
            j.ch(',');
            j.str(row.cmd ? row.cmd : "");
            j.ch(',');
            j.str(row.tensor);
            for (int64_t v : { row.bytes, row.sent, row.recv, row.t_queue - t0, row.t_start - t0, row.t_sent - t0,
                               row.t_end - t0 }) {
                j.ch(',');
                j.i64(v);
            }
            j.ch(']');
        }
        j.ch(']');
        j.ch('}');
        lines.push_back(std::move(line));
    }
}

// does sched compute on an RPC device?
bool has_rpc_backend(ggml_backend_sched_t sched) {
    for (int i = 0; sched && i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_dev_t dev = ggml_backend_get_device(ggml_backend_sched_get_backend(sched, i));
        if (dev && strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0) {
            return true;
        }
    }
    return false;
}

}  // namespace

bool llama_instr::rpc_record_load(bool on) {
    recorder &                  r = R();
    std::lock_guard<std::mutex> lock(r.mtx);
    if (!look_up(r)) {
        return false;
    }
    if (!r.session_on) {
        if (!on) {
            r.rows.clear();
            r.dropped = 0;
        }
        r.load_on = on;
        install(r);
    }
    return true;
}

void llama_instr::rpc_session_begin(const std::string & sid, std::vector<std::string> & lines) {
    recorder &                  r = R();
    std::lock_guard<std::mutex> lock(r.mtx);
    if (!look_up(r)) {
        return;
    }
    if (!r.rows.empty() || r.dropped > 0) {
        format_rows(r.rows, 0, r.rows.size(), sid, "load", 0, -1, r.dropped, lines);
    }
    r.rows.clear();
    r.dropped = 0;
    r.graphs.clear();
    r.load_on    = false;
    r.session_on = true;
    r.stepped    = false;
    install(r);
}

void llama_instr::rpc_session_end(const std::string & sid, std::vector<std::string> & lines) {
    recorder &                  r = R();
    std::lock_guard<std::mutex> lock(r.mtx);
    if (!r.session_on) {
        return;
    }
    if (!r.rows.empty() || r.dropped > 0) {
        format_rows(r.rows, 0, r.rows.size(), sid, r.stepped ? "between" : "load", 0, -1, r.dropped, lines);
    }
    r.rows.clear();
    r.dropped = 0;
    r.graphs.clear();
    r.session_on = false;
    install(r);
}

void llama_instr::rpc_step_lines(const void *               owner,
                                 ggml_backend_sched_t       sched,
                                 const std::string &        sid,
                                 int32_t                    ctx_id,
                                 int64_t                    step,
                                 int64_t                    t_step,
                                 std::vector<std::string> & lines) {
    recorder & r = R();
    t_owner      = nullptr;  // the step's commands are all issued: this thread's next ones are not its
    {
        std::lock_guard<std::mutex> lock(r.mtx);
        if (!r.session_on) {
            return;
        }
    }
    // what the step queued last (the logits' read) completes first; the step's end time is taken
    if (has_rpc_backend(sched)) {
        ggml_backend_sched_synchronize(sched);
    }
    std::vector<transfer_row> rows;
    int64_t                   dropped = 0;
    bool                      stepped = false;
    {
        std::lock_guard<std::mutex> lock(r.mtx);
        // this step's rows and no step's; other owners' stay for their own steps' ends
        const auto                  mine = std::stable_partition(r.rows.begin(), r.rows.end(),
                                                                 [owner](const transfer_row & row) { return takes(row.owner, owner); });
        rows.assign(r.rows.begin(), mine);
        r.rows.erase(r.rows.begin(), mine);
        dropped   = r.dropped;
        r.dropped = 0;
        stepped   = r.stepped;
        r.stepped = true;
    }
    if (rows.empty() && dropped == 0) {
        return;
    }
    // rows end in the order the connections finished them; earlier ones first (before the first
    // step: the load's), then the step's
    const auto   mid      = std::stable_partition(rows.begin(), rows.end(),
                                                  [t_step](const transfer_row & row) { return row.t_queue < t_step; });
    const size_t n_before = (size_t) (mid - rows.begin());
    if (n_before > 0) {
        format_rows(rows, 0, n_before, sid, stepped ? "between" : "load", 0, -1, 0, lines);
    }
    if (n_before < rows.size() || dropped > 0) {
        format_rows(rows, n_before, rows.size(), sid, "step", ctx_id, step, dropped, lines);
    }
}

int32_t llama_instr::rpc_remote_timing(ggml_backend_dev_t dev) {
    recorder &                           r = R();
    ggml_backend_rpc_dev_remote_timing_t fn;
    {
        std::lock_guard<std::mutex> lock(r.mtx);
        look_up(r);
        fn = r.remote_timing;
    }
    return fn ? fn(dev) : -1;
}

void llama_instr::rpc_sync_times(ggml_backend_t backend) {
    recorder &                       r = R();
    ggml_backend_rpc_profiler_sync_t fn;
    {
        std::lock_guard<std::mutex> lock(r.mtx);
        look_up(r);
        fn = r.sync;
    }
    if (fn) {
        fn(backend);
    }
}

void llama_instr::rpc_set_owner(const void * owner) {
    t_owner = owner;
}

const void * llama_instr::rpc_owner() {
    return t_owner;
}

void llama_instr::rpc_take_graphs(int32_t                     device,
                                  const void *                owner,
                                  int64_t                     t_since,
                                  int64_t                     t_until,
                                  std::vector<remote_graph> & out) {
    recorder &                  r = R();
    std::lock_guard<std::mutex> lock(r.mtx);
    out.clear();
    auto keep = r.graphs.begin();
    for (auto it = r.graphs.begin(); it != r.graphs.end(); ++it) {
        if (it->device != device || !takes(it->owner, owner) || it->t_queue > t_until) {
            if (keep != it) {
                *keep = std::move(*it);
            }
            ++keep;
        } else if (it->t_queue >= t_since) {
            out.push_back(std::move(*it));
        }
    }
    r.graphs.erase(keep, r.graphs.end());
}
