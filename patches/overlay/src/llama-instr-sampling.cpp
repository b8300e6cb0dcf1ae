// llamacpp-instr: the host's work between a context's steps (see llama-instr-sampling.h).
//
// A sampling scope lives on the thread that samples: its parts (each sampler of the chain, the
// grammar's passes, the candidates) are kept in a fixed array there and added to the context's
// window when the outermost scope closes, under the window's lock: one lock per output sampled,
// and nothing allocated once the window has seen its sequences and names.

#include "llama-instr-sampling.h"

#include "llama-instr-hooks.h"
#include "llama-instr-registry.h"
#include "llama-sampler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <unordered_map>

std::atomic<int32_t> g_llama_instr_chains{ 0 };

using namespace llama_instr;

namespace {

constexpr size_t  MAX_SCOPE_PARTS  = 64;    // parts one scope keeps (more are counted dropped)
constexpr size_t  MAX_SEQS         = 256;   // sequences a window keeps apart (more are dropped)
constexpr size_t  MAX_PARTS        = 64;    // names a sequence's window keeps apart
constexpr size_t  MAX_SEQ_REQUESTS = 1024;  // sequences whose request a context remembers
constexpr size_t  MAX_CHAIN_NAMES  = 64;    // samplers a chain record names
constexpr size_t  BINDINGS         = 32;    // samplers a thread remembers the context and sequence of
constexpr int32_t SEQ_NONE         = -1;

const char * const k_kind_names[] = { "sampler", "grammar", "sampling", "backend", "host" };

// A sampler's name as llama_sampler_name gives it, or "custom" for one without a name (a
// program's own sampler, such as llama-cpp-python's logits processors, may have none).
const char * sampler_name(const llama_sampler * s) noexcept {
    if (!s || !s->iface || !s->iface->name) {
        return "custom";
    }
    const char * n = s->iface->name(s);
    return n && *n ? n : "custom";
}

// `smpl` when it is a sampler chain (llama_sampler_chain_init), else nullptr.
const llama_sampler_chain * as_chain(const llama_sampler * smpl) noexcept {
    llama_sampler * s = const_cast<llama_sampler *>(smpl);
    return s && llama_sampler_chain_get(s, -1) == s ? (const llama_sampler_chain *) s->ctx : nullptr;
}

// a scope's part: one name's time summed over the scope (a prompt's accept of 290 tokens runs
// each sampler 290 times: one part each, not 290)
struct scope_part {
    const char * name;
    int8_t       kind;
    int64_t      ns;
    int64_t      n;
};

// The open sampling scope of this thread.
struct sample_scope {
    bool                  open      = false;
    bool                  implicit  = false;  // opened by a chain used outside any scope
    bool                  detailed  = false;  // its parts are timed
    int32_t               chains    = 0;      // chains being applied or accepting (the outermost times its members)
    ctx_state *           st        = nullptr;
    const llama_context * ctx       = nullptr;
    const llama_sampler * smpl      = nullptr;
    int32_t               seq       = SEQ_NONE;  // known at the start (explicit, or the sampler's last)
    int32_t               idx       = 0;
    bool                  by_idx    = false;     // the sequence is the output idx's (told at the end)
    bool                  token     = false;     // an output sampled (not only tokens accepted)
    int64_t               t_start   = 0;
    int64_t               excl_ns   = 0;         // work inside it that is no sampling's (a synchronization's)
    int64_t               chain_ns  = 0;
    size_t                n_parts   = 0;
    int64_t               n_dropped = 0;
    scope_part            parts[MAX_SCOPE_PARTS];
};

thread_local sample_scope t_scope;

// A sampler's context and sequence, as its last sampling on this thread told them; most recent
// first.
struct binding {
    const llama_sampler * smpl       = nullptr;
    const llama_context * ctx        = nullptr;
    int32_t               seq        = SEQ_NONE;
    uint64_t              registered = 0;  // the session epoch its chain was registered in (0: never)
    uint64_t              frees      = 0;  // g_chain_frees when it was registered
};

// Bumped by every free of a chain a session saw: a registration on any thread may name a chain
// freed since, whose address a new chain can take (llama-cpp-python makes a chain per completion).
std::atomic<uint64_t> g_chain_frees{ 0 };

thread_local binding               t_bind[BINDINGS];
thread_local const llama_context * t_last_ctx = nullptr;  // the context this thread decoded last

binding * find_binding(const llama_sampler * smpl) noexcept {
    for (auto & b : t_bind) {
        if (b.smpl == smpl && smpl) {
            return &b;
        }
    }
    return nullptr;
}

// smpl's binding, made the most recent (a new one replaces the least recent)
binding & bind(const llama_sampler * smpl) noexcept {
    if (t_bind[0].smpl == smpl) {
        return t_bind[0];
    }
    binding * b   = find_binding(smpl);
    binding   cur = b ? *b : binding{};
    binding * end = b ? b : &t_bind[BINDINGS - 1];
    for (binding * p = end; p > &t_bind[0]; p--) {
        *p = *(p - 1);
    }
    t_bind[0]      = cur;
    t_bind[0].smpl = smpl;
    return t_bind[0];
}

// The chains sessions saw, alive: their `chain` record is written when they are freed, or at the
// session's end. llama.cpp's counters of a chain are read only by a thread that owns it: the one
// sampling with it (after each sampling, into `t_sample_us` and `n_sample` here) or freeing it;
// the session's end, on any thread, writes what the last sampling read.
struct chain_entry {
    uint64_t                 epoch = 0;
    std::string              sid;
    int32_t                  ctx_id = 0;
    int32_t                  seq    = SEQ_NONE;
    std::string              request;
    std::vector<std::string> samplers;  // names, at most MAX_CHAIN_NAMES
    int64_t                  t_sample_us = 0;
    int32_t                  n_sample    = 0;
};

std::mutex & chains_mtx() {
    static std::mutex * m = new std::mutex;  // never destroyed: a chain may be freed at exit
    return *m;
}

std::unordered_map<const llama_sampler *, chain_entry> & chains() {
    static auto * m = new std::unordered_map<const llama_sampler *, chain_entry>;
    return *m;
}

// llama.cpp's counters of chain `c` into `e` (on a thread that owns the chain)
void read_counters(const llama_sampler_chain * c, chain_entry & e) noexcept {
    e.t_sample_us = c->t_sample_us;
    e.n_sample    = c->n_sample;
}

void chain_line(const chain_entry & e, std::string & line) {
    json_out j{ line };
    record_head(j, "chain", now_ns(), e.sid);
    j.key("ctx");
    j.i64(e.ctx_id);
    j.key("seq");
    j.i64(e.seq);
    if (!e.request.empty()) {
        j.key("request");
        j.str(e.request);
    }
    j.key("samplers");
    j.ch('[');
    for (const std::string & name : e.samplers) {
        j.sep();
        j.str(name);
    }
    j.ch(']');
    j.key("t_sample_us");
    j.i64(e.t_sample_us);
    j.key("n_sample");
    j.i64(std::max(0, e.n_sample));
    j.ch('}');
}

// the request sequence `seq` serves, as the window knows it (with win.mtx held)
const std::string & seq_request_locked(const host_window & win, int32_t seq) {
    for (const auto & p : win.seq_request) {
        if (p.first == seq) {
            return p.second;
        }
    }
    return win.ctx_request;
}

// the window's entry of `seq` and the request it serves now (a slot that ends a request and begins
// the next within one window has an entry for each), or nullptr past MAX_SEQS (with win.mtx held)
host_seq * seq_entry_locked(host_window & win, int32_t seq) {
    const std::string & request = seq_request_locked(win, seq);
    for (size_t i = win.n_seqs; i-- > 0;) {
        if (win.seqs[i].seq == seq && win.seqs[i].request == request) {
            return &win.seqs[i];
        }
    }
    if (win.n_seqs == MAX_SEQS) {
        return nullptr;
    }
    if (win.seqs.size() == win.n_seqs) {
        win.seqs.emplace_back();
    }
    host_seq & q = win.seqs[win.n_seqs++];
    q.seq        = seq;
    q.request    = request;
    q.n_sampled = q.sample_ns = q.chain_ns = q.host_ns = 0;
    q.t_first = q.t_last = 0;
    q.n_parts            = 0;
    return &q;
}

void add_time_locked(host_seq & q, int64_t t0, int64_t t1) {
    q.t_first = q.t_first == 0 || t0 < q.t_first ? t0 : q.t_first;
    q.t_last  = t1 > q.t_last ? t1 : q.t_last;
}

// add `ns` under `name` to q's parts (with win.mtx held)
void add_part_locked(host_window & win, host_seq & q, int8_t kind, const char * name, int64_t ns, int64_t n) {
    for (size_t i = 0; i < q.n_parts; i++) {
        host_part & p = q.parts[i];
        if (p.kind == kind && strncmp(p.name, name, sizeof(p.name) - 1) == 0) {
            p.ns += ns;
            p.n += n;
            return;
        }
    }
    if (q.n_parts == MAX_PARTS) {
        win.n_dropped += n;
        return;
    }
    if (q.parts.size() == q.n_parts) {
        q.parts.emplace_back();
    }
    host_part & p = q.parts[q.n_parts++];
    snprintf(p.name, sizeof(p.name), "%s", name);
    p.kind = kind;
    p.ns   = ns;
    p.n    = n;
}

// the sequence of output idx of the window's step (with win.mtx held)
int32_t output_seq_locked(const host_window & win, int32_t idx) {
    int64_t i = idx;
    if (idx < 0) {
        const int64_t j = (int64_t) win.out_tok.size() + idx;
        if (j < 0) {
            return SEQ_NONE;
        }
        i = win.out_tok[j];
    }
    return i >= 0 && i < (int64_t) win.tok_seq.size() ? win.tok_seq[i] : SEQ_NONE;
}

// DETAILED: each sequence of the window (its request, its times from t0) and the parts of its
// host's work (with win.mtx held)
void write_seqs_locked(json_out & j, const host_window & win, int64_t t0) {
    j.key("seqs");
    j.ch('[');
    for (size_t i = 0; i < win.n_seqs; i++) {
        const host_seq & q = win.seqs[i];
        j.sep();
        j.ch('[');
        j.i64(q.seq);
        j.ch(',');
        if (q.request.empty()) {
            j.null();
        } else {
            j.str(q.request);
        }
        j.ch(',');
        j.i64s({ q.n_sampled, q.sample_ns, q.chain_ns, q.host_ns, q.t_first - t0, q.t_last - t0 });
        j.ch(']');
    }
    j.ch(']');
    j.key("parts");
    j.ch('[');
    for (size_t i = 0; i < win.n_seqs; i++) {
        const host_seq & q = win.seqs[i];
        for (size_t k = 0; k < q.n_parts; k++) {
            const host_part & p = q.parts[k];
            j.sep();
            j.ch('[');
            j.i64((int64_t) i);  // the row of `seqs` it belongs to
            j.ch(',');
            j.str(k_kind_names[p.kind]);
            j.ch(',');
            j.str(p.name);
            j.ch(',');
            j.i64s({ p.ns, p.n });
            j.ch(']');
        }
    }
    j.ch(']');
    if (win.n_dropped > 0) {
        j.key("dropped");
        j.i64(win.n_dropped);
    }
}

// the record of the window (with win.mtx held); false when it holds nothing
bool format_locked(host_window & win, std::string & line) {
    if (win.n_seqs == 0) {
        return false;
    }
    const int32_t level   = win.level.load(std::memory_order_relaxed);
    int64_t       sampled = 0, sample_ns = 0, chain_ns = 0, host_ns = 0;
    int64_t       t0 = 0, t1 = 0;
    for (size_t i = 0; i < win.n_seqs; i++) {
        const host_seq & q = win.seqs[i];
        sampled += q.n_sampled;
        sample_ns += q.sample_ns;
        chain_ns += q.chain_ns;
        host_ns += q.host_ns;
        t0 = t0 == 0 || (q.t_first && q.t_first < t0) ? q.t_first : t0;
        t1 = std::max(t1, q.t_last);
    }
    line.clear();
    json_out j{ line };
    record_head(j, "host", now_ns(), win.sid);
    j.key("ctx");
    j.i64(win.ctx_id);
    j.key("step");
    j.i64(win.step);
    j.key("level");
    j.str(level_name(level));
    j.key("t_start");
    j.i64(t0);
    j.key("dur");
    j.i64(t1 - t0);
    j.key("sampled");
    j.i64(sampled);
    j.key("sample_ns");
    j.i64(sample_ns);
    j.key("chain_ns");
    j.i64(chain_ns);
    j.key("host_ns");
    j.i64(host_ns);
    if (win.cpu_ns >= 0) {
        j.key("cpu_ns");
        j.i64(win.cpu_ns);
    }
    if (level >= LLAMA_INSTR_LEVEL_DETAILED) {
        write_seqs_locked(j, win, t0);
    }
    j.ch('}');
    win.n_seqs    = 0;
    win.n_dropped = 0;
    win.cpu_ns    = -1;
    return true;
}

// Register `smpl` (a chain, owned by this thread while it samples) for its `chain` record: its
// first sampling in session `e.epoch` names its context, sequence and samplers.
void register_chain(const llama_sampler * smpl, chain_entry && e) {
    const llama_sampler_chain * c = as_chain(smpl);
    for (const auto & s : c->samplers) {
        if (e.samplers.size() == MAX_CHAIN_NAMES) {
            break;
        }
        const char * name = sampler_name(s.ptr);
        e.samplers.emplace_back(name, std::min<size_t>(strlen(name), 31));
    }
    read_counters(c, e);
    std::lock_guard<std::mutex> lock(chains_mtx());
    auto                        it = chains().find(smpl);
    if (it == chains().end()) {
        g_llama_instr_chains.fetch_add(1, std::memory_order_relaxed);
        chains().emplace(smpl, std::move(e));
    } else if (it->second.epoch != e.epoch) {
        it->second = std::move(e);     // (an entry of an ended session)
    } else {
        read_counters(c, it->second);  // registered on another thread: the first one's names stay
    }
}

// llama.cpp's counters of `smpl` after this thread's sampling with it, for the session's end.
void update_chain(const llama_sampler * smpl, uint64_t epoch) {
    std::lock_guard<std::mutex> lock(chains_mtx());
    auto                        it = chains().find(smpl);
    if (it != chains().end() && it->second.epoch == epoch) {
        read_counters(as_chain(smpl), it->second);
    }
}

// Add the closed scope to its context's window.
void commit(sample_scope & sc, int64_t t_end) {
    host_window & win = sc.st->between;
    chain_entry   entry;
    bool          new_chain = false;
    uint64_t      epoch     = 0;
    {
        std::lock_guard<std::mutex> lock(win.mtx);
        if (win.level.load(std::memory_order_relaxed) == LLAMA_INSTR_LEVEL_OFF) {
            return;
        }
        const int32_t seq = sc.by_idx ? output_seq_locked(win, sc.idx) : sc.seq;
        host_seq *    q   = seq_entry_locked(win, seq);
        if (!q) {
            win.n_dropped += (int64_t) sc.n_parts;
            return;
        }
        q->n_sampled += sc.token ? 1 : 0;
        q->sample_ns += std::max<int64_t>(0, t_end - sc.t_start - sc.excl_ns);
        q->chain_ns += sc.chain_ns;
        add_time_locked(*q, sc.t_start, t_end);
        if (sc.detailed) {
            int64_t members = 0;
            for (size_t i = 0; i < sc.n_parts; i++) {
                const scope_part & p = sc.parts[i];
                add_part_locked(win, *q, p.kind, p.name, p.ns, p.n);
                members += p.kind == LLAMA_INSTR_PART_SAMPLER ? p.ns : 0;
            }
            if (sc.chain_ns > 0) {
                // the chain's own time: its loop, and the timing of its samplers
                add_part_locked(win, *q, LLAMA_INSTR_PART_SAMPLING, "chain",
                                std::max<int64_t>(0, sc.chain_ns - members), 1);
            }
            win.n_dropped += sc.n_dropped;
        }
        if (!sc.smpl) {
            return;
        }
        binding & b = bind(sc.smpl);
        b.ctx       = sc.ctx;
        b.seq       = seq;
        if (!as_chain(sc.smpl)) {
            return;
        }
        epoch                = win.epoch;
        const uint64_t frees = g_chain_frees.load(std::memory_order_acquire);
        if (b.registered != win.epoch || b.frees != frees) {
            // this session's first sampling with the chain, or a chain freed since, whose address
            // this one may have taken
            b.registered  = win.epoch;
            b.frees       = frees;
            new_chain     = true;
            entry.epoch   = win.epoch;
            entry.sid     = win.sid;
            entry.ctx_id  = win.ctx_id;
            entry.seq     = seq;
            entry.request = q->request;
        }
    }
    // (the registry's lock after the window's)
    if (new_chain) {
        register_chain(sc.smpl, std::move(entry));
    } else if (epoch != 0) {
        update_chain(sc.smpl, epoch);
    }
}

void push_part(sample_scope & sc, int8_t kind, const char * name, int64_t ns) noexcept {
    // most recent first: a chain's samplers come round in the same order
    for (size_t i = sc.n_parts; i-- > 0;) {
        scope_part & p = sc.parts[i];
        if (p.kind == kind && (p.name == name || strcmp(p.name, name) == 0)) {
            p.ns += ns;
            p.n++;
            return;
        }
    }
    if (sc.n_parts == MAX_SCOPE_PARTS) {
        sc.n_dropped++;
        return;
    }
    sc.parts[sc.n_parts++] = { name, kind, ns, 1 };
}

// Open this thread's scope on ctx (or, ctx NULL, on smpl's last context and sequence); 0 when it
// records nothing.
int64_t open_scope(const llama_context * ctx,
                   int32_t               seq,
                   int32_t               idx,
                   bool                  by_idx,
                   const llama_sampler * smpl,
                   bool                  token,
                   bool                  implicit) noexcept {
    sample_scope & sc = t_scope;
    if (sc.open) {
        return 0;
    }
    if (!ctx) {
        const binding * b = find_binding(smpl);
        if (b && b->ctx) {
            ctx = b->ctx;
            seq = b->seq;
        } else {
            // a sampler that never sampled on this thread (tokens accepted before its first
            // sampling): this thread's last context, no sequence in particular
            ctx = t_bind[0].ctx ? t_bind[0].ctx : t_last_ctx;
            seq = SEQ_NONE;
        }
        by_idx = false;
    }
    ctx_state * st = ctx ? ctx_find(ctx) : nullptr;
    if (!st) {
        return 0;
    }
    const int32_t level = st->between.level.load(std::memory_order_relaxed);
    if (level == LLAMA_INSTR_LEVEL_OFF) {
        return 0;
    }
    sc.open      = true;
    sc.implicit  = implicit;
    sc.detailed  = level >= LLAMA_INSTR_LEVEL_DETAILED;
    sc.chains    = 0;
    sc.st        = st;
    sc.ctx       = ctx;
    sc.smpl      = smpl;
    sc.seq       = seq;
    sc.idx       = idx;
    sc.by_idx    = by_idx;
    sc.token     = token;
    sc.excl_ns   = 0;
    sc.chain_ns  = 0;
    sc.n_parts   = 0;
    sc.n_dropped = 0;
    sc.t_start   = now_ns();
    return sc.t_start > 0 ? sc.t_start : 1;
}

void close_scope() noexcept {
    sample_scope & sc = t_scope;
    if (!sc.open) {
        return;
    }
    const int64_t t_end = now_ns();
    sc.open             = false;
    try {
        commit(sc, t_end);
    } catch (...) {
        hook_failed(sc.st->between.epoch, "llama_instr_sample_end");
    }
}

}  // namespace

namespace llama_instr {

void host_log_part(ctx_state & st, int64_t t_start, const char * name) {
    const int64_t               t_end = now_ns();
    host_window &               win   = st.between;
    std::lock_guard<std::mutex> lock(win.mtx);
    const int32_t               level = win.level.load(std::memory_order_relaxed);
    host_seq *                  q     = level == LLAMA_INSTR_LEVEL_OFF ? nullptr : seq_entry_locked(win, SEQ_NONE);
    if (!q) {
        return;
    }
    q->host_ns += t_end - t_start;
    add_time_locked(*q, t_start, t_end);
    if (level >= LLAMA_INSTR_LEVEL_DETAILED) {
        add_part_locked(win, *q, LLAMA_INSTR_PART_HOST, name, t_end - t_start, 1);
    }
}

void sampling_exclude(int64_t t_start, int64_t t_end) noexcept {
    sample_scope & sc = t_scope;
    if (sc.open && t_end > t_start) {
        sc.excl_ns += t_end - t_start;
    }
}

int64_t thread_cpu_ns() noexcept {
#if defined(_WIN32)
    return -1;
#else
    timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return -1;
    }
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

void host_step_begin(ctx_state & st, int64_t t_start) {
    const int64_t cpu = thread_cpu_ns();
    host_log_part(st, t_start, "log-begin");
    bool     have  = false;
    uint64_t epoch = 0;
    {
        std::lock_guard<std::mutex> lock(st.between.mtx);
        host_window &               win = st.between;
        const bool same = win.cpu_at_end >= 0 && cpu >= win.cpu_at_end && win.cpu_thread == std::this_thread::get_id();
        win.cpu_ns      = same ? cpu - win.cpu_at_end : -1;
        epoch           = st.between.epoch;
        have            = format_locked(st.between, st.line);
    }
    if (have) {
        emit(epoch, st.line);
    }
}

void host_step_end(ctx_state & st, const llama_context * ctx, const llama_batch & batch, int64_t cpu_end) {
    t_last_ctx                      = ctx;
    host_window &               win = st.between;
    std::lock_guard<std::mutex> lock(win.mtx);
    win.cpu_at_end = cpu_end;
    win.cpu_thread = std::this_thread::get_id();
    win.cpu_ns     = -1;
    if (win.epoch != st.epoch) {
        win.n_seqs    = 0;  // (a window of an ended session, written at its end or dropped)
        win.n_dropped = 0;
    }
    win.epoch       = st.epoch;
    win.sid         = st.sid;
    win.ctx_id      = st.id;
    win.step        = st.step;
    win.ctx_request = st.request;
    const int32_t n = std::max(0, batch.n_tokens);
    win.tok_seq.resize(n);
    win.out_tok.clear();
    for (int32_t i = 0; i < n; i++) {
        win.tok_seq[i] = batch.seq_id && batch.n_seq_id && batch.n_seq_id[i] > 0 ? batch.seq_id[i][0] : 0;
        if (batch.logits ? batch.logits[i] != 0 : i == n - 1) {
            win.out_tok.push_back(i);
        }
    }
    win.level.store(std::max<int32_t>(st.level, LLAMA_INSTR_LEVEL_MINIMAL), std::memory_order_relaxed);
}

std::string seq_request(ctx_state & st, int32_t seq) {
    std::lock_guard<std::mutex> lock(st.between.mtx);
    return seq >= 0 ? seq_request_locked(st.between, seq) : st.between.ctx_request;
}

bool host_record(ctx_state & st, uint64_t epoch, std::string & line) {
    std::lock_guard<std::mutex> lock(st.between.mtx);
    if (st.between.epoch != epoch) {
        return false;
    }
    const bool have = format_locked(st.between, line);
    st.between.level.store(LLAMA_INSTR_LEVEL_OFF, std::memory_order_relaxed);
    return have;
}

void perf_seen(ctx_state & st, const llama_context * ctx) {
    if (st.encoder) {
        return;
    }
    const llama_perf_context_data d = llama_perf_context(ctx);
    std::lock_guard<std::mutex>   lock(st.between.mtx);
    st.between.perf      = d;
    st.between.have_perf = true;
}

bool perf_record(const llama_context * ctx, ctx_state & st, uint64_t epoch, bool freeing, std::string & line) {
    if (!ctx || st.epoch != epoch || st.encoder) {
        return false;  // (an encoder has no llama.cpp counters)
    }
    llama_perf_context_data d{};
    {
        std::lock_guard<std::mutex> lock(st.between.mtx);
        if (freeing || st.between.cpu_thread == std::this_thread::get_id()) {
            d = llama_perf_context(ctx);  // (a thread in here decodes nothing meanwhile)
        } else if (st.between.have_perf) {
            d = st.between.perf;
        } else {
            return false;
        }
    }
    line.clear();
    json_out j{ line };
    record_head(j, "perf", now_ns(), st.sid);
    j.key("ctx");
    j.i64(st.id);
    j.key("t_p_eval_us");
    j.i64((int64_t) (d.t_p_eval_ms * 1000.0 + 0.5));
    j.key("n_p_eval");
    j.i64(d.n_p_eval);
    j.key("t_eval_us");
    j.i64((int64_t) (d.t_eval_ms * 1000.0 + 0.5));
    j.key("n_eval");
    j.i64(d.n_eval);
    j.key("n_reused");
    j.i64(d.n_reused);
    j.ch('}');
    return true;
}

void chains_session_end_locked(const std::string & sid, std::vector<std::string> & lines) {
    std::lock_guard<std::mutex> lock(chains_mtx());
    for (const auto & [smpl, e] : chains()) {
        if (e.sid == sid) {
            lines.emplace_back();
            chain_line(e, lines.back());  // (the chain may be sampling on another thread: not read)
        }
    }
    g_llama_instr_chains.fetch_sub((int32_t) chains().size(), std::memory_order_relaxed);
    chains().clear();
}

}  // namespace llama_instr

//
// llama-sampler.cpp's hooks
//

int64_t llama_instr_sampling_now() noexcept {
    return now_ns();
}

int64_t llama_instr_chain_begin(const llama_sampler * chain, bool * members, bool * opened) noexcept {
    sample_scope & sc = t_scope;
    if (!sc.open) {
        if (open_scope(nullptr, SEQ_NONE, 0, false, chain, false, true) == 0) {
            return 0;
        }
        *opened = true;
    }
    if (sc.chains > 0) {
        return 0;  // a chain inside a chain: its time is its parent's member's
    }
    sc.chains = 1;
    *members  = sc.detailed;
    return now_ns();
}

void llama_instr_chain_end(int64_t t_start) noexcept {
    const int64_t  t  = now_ns();
    sample_scope & sc = t_scope;
    if (sc.open) {
        sc.chain_ns += t - t_start;
        sc.chains = 0;
    }
}

void llama_instr_chain_close() noexcept {
    if (t_scope.implicit) {
        close_scope();
    }
}

void llama_instr_member_end(const llama_sampler * member, int64_t t_start) noexcept {
    sample_scope & sc = t_scope;
    if (sc.open) {
        push_part(sc, LLAMA_INSTR_PART_SAMPLER, sampler_name(member), now_ns() - t_start);
    }
}

void llama_instr_member_on_backend(const llama_sampler * member) noexcept {
    sample_scope & sc = t_scope;
    if (sc.open) {
        push_part(sc, LLAMA_INSTR_PART_BACKEND, sampler_name(member), 0);
    }
}

void llama_instr_chain_free(const llama_sampler * chain) noexcept {
    try {
        chain_entry e;
        {
            std::lock_guard<std::mutex> lock(chains_mtx());
            auto                        it = chains().find(chain);
            if (it == chains().end()) {
                return;
            }
            // out of the registry before anything that can fail: nothing may name a freed chain
            e = std::move(it->second);
            chains().erase(it);
            g_llama_instr_chains.fetch_sub(1, std::memory_order_relaxed);
            g_chain_frees.fetch_add(1, std::memory_order_release);
        }
        if (const llama_sampler_chain * c = as_chain(chain)) {
            read_counters(c, e);  // (the thread that frees it owns it)
        }
        std::string line;
        chain_line(e, line);
        emit(e.epoch, line);
    } catch (...) {
        // out of memory: the chain's record is lost with it
    }
}

//
// the public API
//

int64_t llama_instr_sample_begin(llama_context * ctx, int32_t idx, const llama_sampler * smpl) noexcept {
    if (!llama_instr_enabled()) {
        return 0;
    }
    return open_scope(ctx, SEQ_NONE, idx, ctx != nullptr, smpl, ctx != nullptr, false);
}

int64_t llama_instr_sample_begin_seq(llama_context * ctx, int32_t seq, const llama_sampler * smpl) noexcept {
    if (!llama_instr_enabled() || !ctx) {
        return 0;
    }
    return open_scope(ctx, seq, 0, false, smpl, false, false);
}

void llama_instr_sample_end(int64_t handle) noexcept {
    if (handle) {
        close_scope();
    }
}

// A scope's parts are timed on a clock that stops for what is no sampling's (excl_ns).
int64_t llama_instr_sample_clock(void) noexcept {
    if (!llama_instr_enabled()) {
        return 0;
    }
    const sample_scope & sc = t_scope;
    return sc.open && sc.detailed ? std::max<int64_t>(1, now_ns() - sc.excl_ns) : 0;
}

void llama_instr_sample_part(int32_t kind, const char * name, int64_t t_start) noexcept {
    if (!t_start || !name || kind < 0 || kind > LLAMA_INSTR_PART_HOST) {
        return;
    }
    sample_scope & sc = t_scope;
    if (sc.open) {
        push_part(sc, (int8_t) kind, name, std::max<int64_t>(0, now_ns() - sc.excl_ns - t_start));
    }
}

void llama_instr_sample_on_backend(const llama_sampler * chain) noexcept {
    sample_scope & sc = t_scope;
    const auto *   c  = as_chain(chain);
    if (!llama_instr_enabled() || !sc.open || !sc.detailed || !c) {
        return;
    }
    for (const auto & s : c->samplers) {
        if (s.is_backend) {
            push_part(sc, LLAMA_INSTR_PART_BACKEND, sampler_name(s.ptr), 0);
        }
    }
}

int64_t llama_instr_host_clock(void) noexcept {
    return llama_instr_enabled() ? now_ns() : 0;
}

void llama_instr_host_part(llama_context * ctx, int32_t seq, const char * name, int64_t t_start) noexcept {
    if (!t_start || !ctx || !name || !llama_instr_enabled()) {
        return;
    }
    const int64_t t_end = now_ns();
    ctx_state *   st    = ctx_find(ctx);
    if (!st) {
        return;
    }
    host_window & win = st->between;
    try {
        std::lock_guard<std::mutex> lock(win.mtx);
        const int32_t               level = win.level.load(std::memory_order_relaxed);
        if (level == LLAMA_INSTR_LEVEL_OFF) {
            return;
        }
        host_seq * q = seq_entry_locked(win, seq < 0 ? SEQ_NONE : seq);
        if (!q) {
            win.n_dropped++;
            return;
        }
        q->host_ns += t_end - t_start;
        add_time_locked(*q, t_start, t_end);
        if (level >= LLAMA_INSTR_LEVEL_DETAILED) {
            add_part_locked(win, *q, LLAMA_INSTR_PART_HOST, name, t_end - t_start, 1);
        }
    } catch (...) {
        hook_failed(win.epoch, "llama_instr_host_part");
    }
}

int32_t llama_instr_set_seq_request(llama_context * ctx, int32_t seq, const char * request_id) noexcept {
    if (!ctx || seq < 0 || seq > 65535 || (request_id && strlen(request_id) > 128)) {
        return LLAMA_INSTR_ERR_INVALID_ARG;
    }
    if (!llama_instr_enabled()) {
        return LLAMA_INSTR_ERR_NO_SESSION;
    }
    ctx_state * st = ctx_get(ctx);
    if (!st) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
    try {
        host_window &               win = st->between;
        std::lock_guard<std::mutex> lock(win.mtx);
        auto &                      v = win.seq_request;
        auto              it = std::find_if(v.begin(), v.end(), [seq](const auto & p) { return p.first == seq; });
        const std::string id = request_id ? request_id : "";
        if (it != v.end()) {
            it->second = id;
        } else if (v.size() < MAX_SEQ_REQUESTS) {
            v.emplace_back(seq, id);
        }
        return LLAMA_INSTR_OK;
    } catch (...) {
        return LLAMA_INSTR_ERR_INTERNAL;
    }
}

//
// the end of a context's state: what its host did after its last step, and llama.cpp's counters
// of its decoding (as the session's end writes them for the contexts still alive)
//

void llama_instr::context_forget(const llama_context * ctx) noexcept {
    try {
        auto &                      s = S();
        std::unique_ptr<ctx_state>  dead;  // freed after the lock is released
        std::lock_guard<std::mutex> lock(s.mtx);
        dead = ctx_forget_locked(s, ctx);
        if (dead && dead->step_open) {
            step_done_locked(s, *dead);  // a step that never ended: the session counts it no more
        }
        std::string line;
        if (dead && s.log.fp && host_record(*dead, s.epoch, line)) {
            s.log.emit(line);
        }
        if (dead && s.log.fp && perf_record(ctx, *dead, s.epoch, true, line)) {
            s.log.emit(line);
        }
    } catch (...) {
        // nothing to report to: the context is going away
    }
}
