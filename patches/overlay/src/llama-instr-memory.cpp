// llamacpp-instr: the backend buffers' observer (every buffer by device and purpose, the failed
// allocations, the memory budget) and the memory figures of each step.

#include "llama-instr-memory.h"

#include "ggml-backend-instr.h"
#include "ggml-backend.h"
#include "llama-context.h"
#include "llama-ext.h"
#include "llama-instr-hooks.h"
#include "llama-instr-registry.h"
#include "llama-kv-cache-iswa.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#if !defined(_WIN32)
#    include <fcntl.h>
#    include <pthread.h>
#    include <unistd.h>
#endif

using namespace llama_instr;

namespace {

const char * const k_purpose_names[] = { "other",     "weights",     "kv_cache",        "compute",        "output",
                                         "recurrent", "host_pinned", "encoder_weights", "encoder_compute" };
constexpr int32_t  k_n_purposes      = (int32_t) (sizeof(k_purpose_names) / sizeof(k_purpose_names[0]));

struct buffer_entry {
    uint64_t                   id;
    int64_t                    ts;
    size_t                     bytes;
    int32_t                    device;  // the ggml device whose memory holds it (a host buffer: the CPU's)
    ggml_backend_buffer_type_t buft;
    int32_t                    purpose;
    int32_t                    cache;  // the KV cache's serial (kv_cache, recurrent), or -1
    const llama_context *      ctx;    // the context it was made for (compute, output), or nullptr
};

struct cache_info {
    int32_t      serial;
    const char * label;
};

struct budget_entry {
    std::string device;
    size_t      bytes;
};

// guarded by mtx; taken after S().mtx when both are held, never before
struct memory_table {
    std::mutex                                              mtx;
    std::unordered_map<ggml_backend_buffer_t, buffer_entry> live;
    uint64_t                                                next_id = 0;
    std::unordered_map<const void *, cache_info>            caches;  // KV caches and recurrent states by owner
    int32_t                                                 next_cache = 0;
    std::vector<budget_entry>                               budget;
    std::unordered_map<int32_t, size_t>                     pending;  // by device: allocations passed, not yet done
    bool                                                    env_read = false;
    std::string                                             last_failure;
};

// never destroyed: buffers are freed until the very end of the process
memory_table & M() {
    static memory_table * m = new memory_table();
    return *m;
}

// backend buffers made or freed so far: a device's free memory is read again after one
std::atomic<uint64_t> g_buffer_events{ 0 };

// each device's free memory as last read (a GPU's query costs tens of us: a step reuses the last
// read unless a buffer was made or freed since, or it is older than FREE_MAX_AGE)
constexpr int64_t FREE_MAX_AGE = 100 * 1000 * 1000;

struct free_cache {
    std::mutex           mtx;
    std::vector<int64_t> free;  // per device; -1: not read (an RPC device)
    int64_t              at     = 0;
    uint64_t             events = UINT64_MAX;
};

free_cache & F() {
    static free_cache * f = new free_cache();
    return *f;
}

// what this thread is allocating for (llama_instr_purpose_scope)
thread_local int32_t      t_purpose = LLAMA_INSTR_PURPOSE_OTHER;
thread_local const void * t_owner   = nullptr;
thread_local int32_t      t_cache   = -1;

// what this thread allocated for before each llama_instr_encoder_buffers not ended yet
struct purpose_saved {
    int32_t      purpose;
    const void * owner;
    int32_t      cache;
};

thread_local purpose_saved t_encoder_saved[LLAMA_INSTR_ENCODER_NESTING];
thread_local int32_t       t_encoder_depth = 0;  // may pass the array's length: those are not saved

// the bytes the budget let this thread's allocation have (may_alloc), counted as used until it is
// done (alloc_done), so that two threads can't both pass with room for one
thread_local int32_t t_held_device = -1;
thread_local size_t  t_held_bytes  = 0;

int32_t device_index(ggml_backend_dev_t dev) {
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        if (ggml_backend_dev_get(i) == dev) {
            return (int32_t) i;
        }
    }
    return -1;
}

int32_t cpu_device_index() {
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            return (int32_t) i;
        }
    }
    return -1;
}

// The device whose memory a buffer of this type takes: a host buffer (a GPU's pinned host memory
// included) is the CPU's memory.
int32_t buft_device(ggml_backend_buffer_type_t buft) {
    if (ggml_backend_buft_is_host(buft)) {
        return cpu_device_index();
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    return dev ? device_index(dev) : -1;
}

bool is_pinned_host(ggml_backend_buffer_type_t buft) {
    if (!ggml_backend_buft_is_host(buft)) {
        return false;
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    return dev && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU;
}

// the live buffers' bytes on device, and the allocations under way that the budget passed
size_t used_on_locked(const memory_table & m, int32_t device) {
    size_t used = 0;
    for (const auto & [buf, e] : m.live) {
        if (e.device == device) {
            used += e.bytes;
        }
    }
    auto it = m.pending.find(device);
    return used + (it == m.pending.end() ? 0 : it->second);
}

const budget_entry * budget_of_locked(const memory_table & m, int32_t device) {
    if (device < 0 || m.budget.empty()) {
        return nullptr;
    }
    const char * name = ggml_backend_dev_name(ggml_backend_dev_get(device));
    for (const auto & b : m.budget) {
        if (strcasecmp(b.device.c_str(), name) == 0) {
            return &b;
        }
    }
    return nullptr;
}

// "512M" -> bytes; false if malformed
bool parse_size(const std::string & v, size_t & out) {
    if (v.empty() || !isdigit((unsigned char) v[0])) {
        return false;
    }
    errno        = 0;
    char * end   = nullptr;
    double value = strtod(v.c_str(), &end);
    if (errno != 0 || end == v.c_str() || !(value >= 0)) {
        return false;
    }
    std::string unit(end);
    for (auto & c : unit) {
        c = (char) toupper((unsigned char) c);
    }
    if (unit == "B" || unit.empty()) {
        // bytes
    } else if (unit == "K" || unit == "KB" || unit == "KIB") {
        value *= 1024.0;
    } else if (unit == "M" || unit == "MB" || unit == "MIB") {
        value *= 1024.0 * 1024.0;
    } else if (unit == "G" || unit == "GB" || unit == "GIB") {
        value *= 1024.0 * 1024.0 * 1024.0;
    } else if (unit == "T" || unit == "TB" || unit == "TIB") {
        value *= 1024.0 * 1024.0 * 1024.0 * 1024.0;
    } else {
        return false;
    }
    if (value > 9.0e18) {
        return false;
    }
    out = (size_t) value;
    return true;
}

bool parse_budget(const char * spec, std::vector<budget_entry> & out, std::string & why) {
    out.clear();
    if (!spec) {
        return true;
    }
    std::string s(spec);
    size_t      p = 0;
    while (p < s.size()) {
        size_t            q    = s.find(',', p);
        const std::string item = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
        p                      = q == std::string::npos ? s.size() : q + 1;
        if (item.empty()) {
            continue;
        }
        const size_t eq = item.find('=');
        budget_entry b;
        if (eq == std::string::npos || eq == 0 || !parse_size(item.substr(eq + 1), b.bytes)) {
            why = "a memory budget is DEVICE=SIZE[,DEVICE=SIZE...] (SIZE such as 512M or 2G), not '" + item + "'";
            return false;
        }
        b.device          = item.substr(0, eq);
        bool        known = false;
        std::string names;
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            const char * name = ggml_backend_dev_name(ggml_backend_dev_get(i));
            known             = known || strcasecmp(name, b.device.c_str()) == 0;
            names += (i ? ", " : "") + std::string(name);
        }
        if (!known) {
            why = "no device '" + b.device + "' for a memory budget (devices: " + names + ")";
            return false;
        }
        out.push_back(b);
    }
    return true;
}

// LLAMA_INSTR_MEMORY_BUDGET, read once, at the first buffer or memory query (the devices exist by
// then); a malformed one is ignored with one warning
void read_env_locked(memory_table & m) {
    if (m.env_read) {
        return;
    }
    m.env_read       = true;
    const char * env = getenv("LLAMA_INSTR_MEMORY_BUDGET");
    if (!env || !*env) {
        return;
    }
    std::string why;
    if (!parse_budget(env, m.budget, why)) {
        m.budget.clear();
        fprintf(stderr, "llamacpp-instr: LLAMA_INSTR_MEMORY_BUDGET ignored: %s\n", why.c_str());
    }
}

void write_entry(json_out & j, const std::string & sid, const buffer_entry & e, const memory_table & m) {
    record_head(j, "memory_alloc", e.ts, sid);
    j.key("id");
    j.i64((int64_t) e.id);
    j.key("device");
    j.i64(e.device);
    j.key("buffer_type");
    j.str(ggml_backend_buft_name(e.buft));
    j.key("bytes");
    j.i64((int64_t) e.bytes);
    j.key("purpose");
    j.str(k_purpose_names[e.purpose]);
    if (e.cache >= 0) {
        j.key("cache");
        j.i64(e.cache);
        for (const auto & [owner, c] : m.caches) {
            if (c.serial == e.cache && c.label) {
                j.key("cache_kind");
                j.str(c.label);
                break;
            }
        }
    }
}

// the session's id for ctx, and its step and graph when ctx is decoding (the allocation is then a
// re-reservation the step's graph caused); with S().mtx held, on the thread that allocates
void write_ctx_locked(json_out & j, session & s, const llama_context * ctx) {
    if (!ctx) {
        return;
    }
    auto it = s.ctxs.find(ctx);
    if (it == s.ctxs.end() || it->second->epoch != s.epoch) {
        return;
    }
    const ctx_state & st = *it->second;
    j.key("ctx");
    j.i64(st.id);
    if (st.in_decode) {
        j.key("step");
        j.i64(st.step);
        if (st.graph_id > 0) {
            j.key("graph");
            j.i64(st.graph_id);
        }
    }
}

// While a session is open, one record made by `write` (given the line's writer and the session)
// is written, and with `flush` written out at once; `write` runs with S().mtx held (the table's
// lock may be taken inside it: the order is S().mtx first).
template <typename F> void emit_if_open(F && write, bool flush = false) {
    if (!llama_instr_enabled()) {
        return;
    }
    auto &                      s = S();
    std::lock_guard<std::mutex> lock(s.mtx);
    if (!s.log.fp) {
        return;
    }
    std::string line;
    json_out    j{ line };
    write(j, s);
    s.log.emit(line);
    if (flush) {
        s.log.write_buffered();
    }
}

void emit_free(const buffer_entry & e) {
    emit_if_open([&](json_out & j, session & s) {
        record_head(j, "memory_free", now_ns(), s.sid);
        j.key("id");
        j.i64((int64_t) e.id);
        j.key("device");
        j.i64(e.device);
        j.key("bytes");
        j.i64((int64_t) e.bytes);
        j.key("purpose");
        j.str(k_purpose_names[e.purpose]);
        j.ch('}');
    });
}

void on_alloc(ggml_backend_buffer_t buffer) {
    g_buffer_events.fetch_add(1, std::memory_order_relaxed);
    try {
        buffer_entry e{};
        e.ts      = now_ns();
        e.bytes   = ggml_backend_buffer_get_size(buffer);
        e.buft    = ggml_backend_buffer_get_type(buffer);
        e.device  = buft_device(e.buft);
        e.purpose = t_purpose;
        if (e.purpose == LLAMA_INSTR_PURPOSE_OTHER && is_pinned_host(e.buft)) {
            e.purpose = LLAMA_INSTR_PURPOSE_HOST_PINNED;
        }
        e.cache        = t_cache;
        // (an encoder's compute buffer: its owner is the encoder, which keys its state as a
        // context's address does, never read as one)
        e.ctx          = e.purpose == LLAMA_INSTR_PURPOSE_COMPUTE || e.purpose == LLAMA_INSTR_PURPOSE_OUTPUT ||
                        e.purpose == LLAMA_INSTR_PURPOSE_ENCODER_COMPUTE ?
                             static_cast<const llama_context *>(t_owner) :
                             nullptr;
        auto &       m = M();
        buffer_entry before{};
        bool         seen = false;
        {
            std::lock_guard<std::mutex> lock(m.mtx);
            read_env_locked(m);
            // a buffer type may make its buffers through another one (the CPU's repacked weights
            // are CPU buffers retyped): the buffer, seen again whole, replaces what was said of it
            auto it = m.live.find(buffer);
            if (it != m.live.end()) {
                before = it->second;
                seen   = true;
            }
            e.id           = ++m.next_id;
            m.live[buffer] = e;
        }
        if (seen) {
            emit_free(before);
        }
        emit_if_open([&](json_out & j, session & s) {
            {
                std::lock_guard<std::mutex> mlock(m.mtx);
                write_entry(j, s.sid, e, m);
            }
            write_ctx_locked(j, s, e.ctx);
            j.ch('}');
        });
    } catch (...) {
        // out of memory: the buffer is not in the table; the allocation itself goes on
    }
}

void on_free(ggml_backend_buffer_t buffer) {
    g_buffer_events.fetch_add(1, std::memory_order_relaxed);
    try {
        auto &       m = M();
        buffer_entry e{};
        {
            std::lock_guard<std::mutex> lock(m.mtx);
            auto                        it = m.live.find(buffer);
            if (it == m.live.end()) {
                return;
            }
            e = it->second;
            m.live.erase(it);
            // a cache whose last buffer is freed is gone (its owner's address may make another)
            if (e.cache >= 0 && std::none_of(m.live.begin(), m.live.end(),
                                             [&](const auto & kv) { return kv.second.cache == e.cache; })) {
                for (auto c = m.caches.begin(); c != m.caches.end();) {
                    c = c->second.serial == e.cache ? m.caches.erase(c) : std::next(c);
                }
            }
        }
        emit_free(e);
    } catch (...) {
    }
}

bool may_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    try {
        const int32_t               device = buft_device(buft);
        auto &                      m      = M();
        std::lock_guard<std::mutex> lock(m.mtx);
        read_env_locked(m);
        const budget_entry * b = budget_of_locked(m, device);
        if (!b) {
            return true;
        }
        const size_t used = used_on_locked(m, device);
        if (used > b->bytes || size > b->bytes - used) {  // (used + size may wrap)
            return false;
        }
        m.pending[device] += size;
        t_held_device = device;
        t_held_bytes  = size;
        return true;
    } catch (...) {
        return true;  // the budget can't be checked: the device decides
    }
}

void alloc_done() {
    if (t_held_device < 0) {
        return;
    }
    try {
        auto &                      m = M();
        std::lock_guard<std::mutex> lock(m.mtx);
        size_t &                    p = m.pending[t_held_device];
        p -= std::min(p, t_held_bytes);
    } catch (...) {
        // the lock failed: the bytes stay held (the budget is the stricter for it)
    }
    t_held_device = -1;
    t_held_bytes  = 0;
}

void on_alloc_failed(ggml_backend_buffer_type_t buft, size_t size, bool by_budget) {
    try {
        const int32_t device = buft_device(buft);
        size_t        free = 0, total = 0;
        if (device >= 0) {
            ggml_backend_dev_memory(ggml_backend_dev_get(device), &free, &total);  // the budget applied
        }
        int32_t purpose = t_purpose;
        if (purpose == LLAMA_INSTR_PURPOSE_OTHER && is_pinned_host(buft)) {
            purpose = LLAMA_INSTR_PURPOSE_HOST_PINNED;
        }
        // the object memory_last_failure() returns; the record holds the same members
        std::string body = "{";
        json_out    j{ body };
        j.key("device");
        j.i64(device);
        j.key("device_name");
        j.str(device >= 0 ? ggml_backend_dev_name(ggml_backend_dev_get(device)) : "");
        j.key("buffer_type");
        j.str(ggml_backend_buft_name(buft));
        j.key("purpose");
        j.str(k_purpose_names[purpose]);
        j.key("bytes");
        j.i64((int64_t) size);
        j.key("free");
        j.i64((int64_t) free);
        j.key("total");
        j.i64((int64_t) total);
        j.key("by_budget");
        j.boolean(by_budget);
        auto & m = M();
        {
            std::lock_guard<std::mutex> lock(m.mtx);
            j.key("budget");
            if (const budget_entry * b = budget_of_locked(m, device)) {
                j.i64((int64_t) b->bytes);
            } else {
                j.null();
            }
            int64_t held[k_n_purposes] = {};
            for (const auto & [buf, e] : m.live) {
                if (e.device == device) {
                    held[e.purpose] += (int64_t) e.bytes;
                }
            }
            j.key("held");
            j.ch('{');
            for (int32_t p = 0; p < k_n_purposes; p++) {
                j.key(k_purpose_names[p]);
                j.i64(held[p]);
            }
            j.ch('}');
            j.ch('}');
            m.last_failure = body;
        }
        emit_if_open(
            [&](json_out & r, session & s) {
                record_head(r, "memory_alloc_failed", now_ns(), s.sid);
                r.ch(',');
                r.raw(body.substr(1));  // the object's members, and its closing brace
            },
            true);                      // llama.cpp may give up, and the program end, right after this
    } catch (...) {
    }
}

void get_memory(ggml_backend_dev_t dev, size_t * free, size_t * total) {
    try {
        const int32_t               device = device_index(dev);
        auto &                      m      = M();
        std::lock_guard<std::mutex> lock(m.mtx);
        read_env_locked(m);
        if (const budget_entry * b = budget_of_locked(m, device)) {
            const size_t used = used_on_locked(m, device);
            *total            = std::min(*total, b->bytes);
            *free             = std::min(*free, b->bytes > used ? b->bytes - used : 0);
        }
    } catch (...) {
    }
}

const ggml_backend_buffer_observer k_observer = {
    on_alloc, on_free, may_alloc, on_alloc_failed, get_memory, alloc_done
};

// set when libllama loads (before any model or context can make a buffer), unset when it unloads
struct observer_install {
    observer_install() { ggml_backend_set_buffer_observer(&k_observer); }

    ~observer_install() { ggml_backend_set_buffer_observer(nullptr); }
} g_observer_install;

#if defined(__linux__)
// /proc/self/statm, opened once and read with pread at each step: opening and closing it cost
// about 35 us of a generation step's serial time (measured in a SmolLM2 decode, where the
// kernel's path walk runs cold after a compute), a read alone about 10. A forked child must not
// read its parent's file: the descriptor is dropped in the child (pthread_atfork), and close on
// exec.
std::atomic<int> g_statm_fd{ -1 };

void statm_drop_in_child() {
    const int fd = g_statm_fd.exchange(-1);
    if (fd >= 0) {
        close(fd);
    }
}

int statm_fd() {
    int fd = g_statm_fd.load(std::memory_order_acquire);
    if (fd >= 0) {
        return fd;
    }
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, statm_drop_in_child); });
    fd           = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    int expected = -1;
    if (fd >= 0 && !g_statm_fd.compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
        close(fd);  // another thread opened it first
        fd = expected;
    }
    return fd;
}
#endif

// resident and file-backed resident bytes of the process (/proc/self/statm: one read, no parsing
// of /proc/self/status), -1 where there is no such file
void read_rss(int64_t & rss, int64_t & rss_file) {
    rss      = -1;
    rss_file = -1;
#if defined(__linux__)
    // A program may close descriptors it did not open (a daemon closing all of them), and the
    // number be reused: what is read must then look like statm (seven numbers), else the number
    // is forgotten (never closed: it may be the program's now) and the file opened again, once.
    for (int attempt = 0; attempt < 2; attempt++) {
        const int fd = statm_fd();
        if (fd < 0) {
            return;
        }
        char          buf[128];
        const ssize_t n    = pread(fd, buf, sizeof(buf) - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        unsigned long long v[7];
        if (n > 0 &&
            sscanf(buf, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) == 7) {
            const int64_t page = (int64_t) sysconf(_SC_PAGESIZE);
            rss                = (int64_t) v[1] * page;
            rss_file           = (int64_t) v[2] * page;
            return;
        }
        int expected = fd;
        g_statm_fd.compare_exchange_strong(expected, -1);
    }
#endif
}

void write_kv(json_out & j, const llama_kv_cache * kv, const memory_table & m) {
    if (!kv) {
        return;
    }
    auto          it     = m.caches.find(kv);
    const int64_t serial = it == m.caches.end() ? -1 : it->second.serial;
    const int64_t n_str  = kv->get_n_stream();
    int64_t       used   = 0;
    for (int64_t s = 0; s < n_str; s++) {
        used += kv->get_cells((llama_seq_id) s).get_used();
    }
    j.sep();
    j.ch('[');
    j.i64s({ serial, used, (int64_t) kv->get_size() * n_str });
    j.ch(']');
}

void write_recurrent(json_out & j, const llama_memory_recurrent * r, const memory_table & m) {
    if (!r) {
        return;
    }
    auto it = m.caches.find(r);
    j.sep();
    j.ch('[');
    j.i64s({ it == m.caches.end() ? -1 : (int64_t) it->second.serial, (int64_t) r->used, (int64_t) r->size });
    j.ch(']');
}

}  // namespace

llama_instr_purpose_scope::llama_instr_purpose_scope(int32_t purpose, const void * owner, const char * label) noexcept :
    prev_purpose(t_purpose),
    prev_owner(t_owner),
    prev_cache(t_cache) {
    t_purpose = purpose >= 0 && purpose < k_n_purposes ? purpose : LLAMA_INSTR_PURPOSE_OTHER;
    t_owner   = owner;
    t_cache   = -1;
    if ((purpose == LLAMA_INSTR_PURPOSE_KV_CACHE || purpose == LLAMA_INSTR_PURPOSE_RECURRENT) && owner) {
        try {
            auto &                      m = M();
            std::lock_guard<std::mutex> lock(m.mtx);
            t_cache         = m.next_cache++;
            m.caches[owner] = { t_cache, label };  // a new cache at a freed one's address is a new cache
        } catch (...) {
        }
    }
}

llama_instr_purpose_scope::~llama_instr_purpose_scope() noexcept {
    t_purpose = prev_purpose;
    t_owner   = prev_owner;
    t_cache   = prev_cache;
}

void llama_instr_encoder_buffers(const void * encoder, int32_t what) noexcept {
    if (what == 1 || what == 2) {
        if (t_encoder_depth < LLAMA_INSTR_ENCODER_NESTING) {
            t_encoder_saved[t_encoder_depth] = { t_purpose, t_owner, t_cache };
        }
        t_encoder_depth++;
        t_purpose = what == 1 ? LLAMA_INSTR_PURPOSE_ENCODER_WEIGHTS : LLAMA_INSTR_PURPOSE_ENCODER_COMPUTE;
        t_owner   = encoder;
        t_cache   = -1;
        return;
    }
    const bool saved = t_encoder_depth > 0 && t_encoder_depth <= LLAMA_INSTR_ENCODER_NESTING;
    t_encoder_depth  = std::max(0, t_encoder_depth - 1);
    const purpose_saved before =
        saved ? t_encoder_saved[t_encoder_depth] : purpose_saved{ LLAMA_INSTR_PURPOSE_OTHER, nullptr, -1 };
    t_purpose = before.purpose;
    t_owner   = before.owner;
    t_cache   = before.cache;
}

namespace llama_instr {

void memory_snapshot_lines(const std::string & sid, std::vector<std::string> & out) {
    auto &                            m = M();
    std::lock_guard<std::mutex>       lock(m.mtx);
    std::vector<const buffer_entry *> entries;
    entries.reserve(m.live.size());
    for (const auto & [buf, e] : m.live) {
        entries.push_back(&e);
    }
    std::sort(entries.begin(), entries.end(),
              [](const buffer_entry * a, const buffer_entry * b) { return a->id < b->id; });
    for (const buffer_entry * e : entries) {
        std::string line;
        json_out    j{ line };
        write_entry(j, sid, *e, m);
        j.ch('}');
        out.push_back(std::move(line));
    }
}

void write_step_memory(json_out & j, const llama_context * ctx) {
    int64_t rss = 0, rss_file = 0;
    read_rss(rss, rss_file);
    j.key("memory");
    j.raw("{\"rss\":");
    j.i64(rss);
    j.raw(",\"rss_file\":");
    j.i64(rss_file);
    j.raw(",\"rss_anon\":");
    j.i64(rss >= 0 ? rss - rss_file : -1);
    j.raw(",\"kv\":[");
    {
        auto &                      m = M();
        std::lock_guard<std::mutex> lock(m.mtx);
        const llama_memory_i *      mem = ctx ? const_cast<llama_context *>(ctx)->get_memory() : nullptr;
        if (const auto * kv = dynamic_cast<const llama_kv_cache *>(mem)) {
            write_kv(j, kv, m);
        } else if (const auto * iswa = dynamic_cast<const llama_kv_cache_iswa *>(mem)) {
            write_kv(j, iswa->get_base(), m);
            write_kv(j, iswa->get_swa(), m);
        } else if (const auto * hybrid = dynamic_cast<const llama_memory_hybrid *>(mem)) {
            write_kv(j, hybrid->get_mem_attn(), m);
            write_recurrent(j, hybrid->get_mem_recr(), m);
        } else if (const auto * rec = dynamic_cast<const llama_memory_recurrent *>(mem)) {
            write_recurrent(j, rec, m);
        }
    }
    j.raw("],\"free\":[");
    auto &                      f = F();
    std::lock_guard<std::mutex> lock(f.mtx);
    const size_t                n      = ggml_backend_dev_count();
    const int64_t               now    = now_ns();
    const uint64_t              events = g_buffer_events.load(std::memory_order_relaxed);
    if (f.free.size() != n || events != f.events || now - f.at >= FREE_MAX_AGE) {
        f.free.assign(n, -1);
        for (size_t i = 0; i < n; i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0) {
                continue;  // a round trip to the server: not on every step
            }
            size_t free = 0, total = 0;
            ggml_backend_dev_memory(dev, &free, &total);
            f.free[i] = (int64_t) free;
        }
        f.at     = now;
        f.events = events;
    }
    for (const int64_t v : f.free) {
        j.sep();
        if (v < 0) {
            j.null();
        } else {
            j.i64(v);
        }
    }
    j.raw("]}");
}

breakdown_totals write_memory_breakdown(json_out & j, const llama_context * ctx, bool with_device) {
    breakdown_totals t;
    for (const auto & [buft, d] : llama_get_memory_breakdown(ctx)) {
        j.sep();
        j.ch('{');
        j.key(with_device ? "buffer_type" : "buffer");
        j.str(ggml_backend_buft_name(buft));
        if (with_device) {
            j.key("device");
            j.i64(buft_device(buft));
        }
        j.key("weights");
        j.i64((int64_t) d.model);
        j.key("kv_cache");
        j.i64((int64_t) d.context);
        j.key("compute");
        j.i64((int64_t) d.compute);
        j.ch('}');
        t.weights += (int64_t) d.model;
        t.kv_cache += (int64_t) d.context;
        t.compute += (int64_t) d.compute;
    }
    return t;
}

std::string memory_breakdown_json(const llama_context * ctx) {
    std::string out;
    json_out    j{ out };
    j.ch('[');
    write_memory_breakdown(j, ctx, true);
    j.ch(']');
    return out;
}

std::string memory_last_failure() {
    auto &                      m = M();
    std::lock_guard<std::mutex> lock(m.mtx);
    return m.last_failure;
}

size_t memory_caches_known() {
    auto &                      m = M();
    std::lock_guard<std::mutex> lock(m.mtx);
    return m.caches.size();
}

bool memory_set_budget(const char * spec, std::string & why) {
    std::vector<budget_entry> b;
    if (!parse_budget(spec, b, why)) {
        return false;
    }
    auto &                      m = M();
    std::lock_guard<std::mutex> lock(m.mtx);
    m.env_read = true;  // set through the API: the environment's no longer applies
    m.budget   = std::move(b);
    return true;
}

}  // namespace llama_instr
