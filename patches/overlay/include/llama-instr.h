#ifndef LLAMA_INSTR_H
#define LLAMA_INSTR_H

// llamacpp-instr: execution-time instrumentation of llama_decode, as a flat C API.
//
// A session writes an NDJSON log (one JSON object per line, schema in llamacpp-instr's
// docs/schema.md) of every llama_decode in the process: the steps, the node table of each compute
// graph, per-op and per-layer times measured by the CPU backend while the graph runs, and at the
// verbose level per-thread times, output value statistics and top-k logits.
//
// Lifetime: llama_instr_session_begin() opens the one session of the process and
// llama_instr_session_end() closes it. Every function but llama_instr_captured_* (see there) may be
// called from any thread at any time; contexts may keep decoding on their own threads while a
// session begins or ends. With no session
// open, each hook inside llama.cpp costs one relaxed atomic load, and no level changes results.
//
// Return codes: a function returning int32_t returns LLAMA_INSTR_OK (0) or a negative
// llama_instr_status, and llama_instr_last_error() then says what went wrong (per thread, like
// errno). Nothing throws across this API.

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
// no exception crosses this API: every function catches its own failures and returns a code
#    define LLAMA_INSTR_NOEXCEPT noexcept
extern "C" {
#else
#    define LLAMA_INSTR_NOEXCEPT
#endif

#define LLAMA_INSTR_API_VERSION 8

enum llama_instr_level {
    LLAMA_INSTR_LEVEL_OFF      = 0,
    LLAMA_INSTR_LEVEL_MINIMAL  = 1,  // steps and per-layer spans
    LLAMA_INSTR_LEVEL_DETAILED = 2,  // + graph tables, per-op timings, token ids and pieces
    LLAMA_INSTR_LEVEL_VERBOSE  = 3,  // + per-thread times, value statistics, top-k logits
};

enum llama_instr_status {
    LLAMA_INSTR_OK              = 0,
    LLAMA_INSTR_ERR_BUSY        = -1,  // a session is already open
    LLAMA_INSTR_ERR_NO_SESSION  = -2,  // no session is open
    LLAMA_INSTR_ERR_INVALID_ARG = -3,  // an argument is out of range
    LLAMA_INSTR_ERR_IO          = -4,  // the log could not be opened, written or closed: records were lost
    LLAMA_INSTR_ERR_INTERNAL    = -5,  // out of memory or another internal failure: records were lost
};

struct llama_instr_totals {
    int64_t n_steps;          // llama_decode calls
    int64_t n_tokens;         // tokens decoded (prompt + generated)
    int64_t n_prompt_tokens;  //
    int64_t n_gen_tokens;     //
    int64_t n_computes;       // graph computes (ubatches)
    int64_t n_records;        // lines written or buffered
    int64_t n_lost;           // records lost to a write error or an internal failure, or refused (write_record)
};

// The C API version (LLAMA_INSTR_API_VERSION) of this library.
LLAMA_API int32_t llama_instr_api_version(void) LLAMA_INSTR_NOEXCEPT;

// A JSON object describing this build, valid for the life of the process:
// {"api_version":3,"llama_cpp_commit":"...","patch_hash":"..."}
LLAMA_API const char * llama_instr_build_info(void) LLAMA_INSTR_NOEXCEPT;

// Open the session: create or append to the log at `path` (NULL or "" =
// llama_instrumentation_YYYYMMDD_HHMMSS.log in the current directory) and record at `level`
// (LLAMA_INSTR_LEVEL_MINIMAL..VERBOSE). `ctx` may be NULL; when given, the session_start record
// carries its model, context parameters, weight inventory and memory breakdown. `metadata_json`,
// a JSON object, is stored verbatim in session_start (NULL = {}).
// Returns LLAMA_INSTR_OK, ERR_BUSY, ERR_INVALID_ARG (level, or metadata that is not an object),
// ERR_IO (the log cannot be opened or written) or ERR_INTERNAL. On error no session is open.
LLAMA_API int32_t llama_instr_session_begin(struct llama_context * ctx,
                                            const char *           path,
                                            int32_t                level,
                                            const char *           metadata_json) LLAMA_INSTR_NOEXCEPT;

// Close the session: write session_end with `status` ("ok", "error" or "interrupted"; NULL = "ok"),
// flush and close the log. The session is closed whatever the result.
// Returns LLAMA_INSTR_OK, ERR_NO_SESSION, ERR_INVALID_ARG (unknown status: "error" is written),
// ERR_IO (a write failed at any time during the session, the log was removed or replaced, or
// closing failed: the log is incomplete) or ERR_INTERNAL (a hook failed: records were lost).
LLAMA_API int32_t llama_instr_session_end(const char * status) LLAMA_INSTR_NOEXCEPT;

// Change the level of the open session (LLAMA_INSTR_LEVEL_OFF pauses recording).
// Returns the previous level (>= 0), ERR_NO_SESSION or ERR_INVALID_ARG.
LLAMA_API int32_t llama_instr_set_level(int32_t level) LLAMA_INSTR_NOEXCEPT;

// The current level (LLAMA_INSTR_LEVEL_OFF when no session is open).
LLAMA_API int32_t llama_instr_get_level(void) LLAMA_INSTR_NOEXCEPT;

// Top logits recorded per output row at the verbose level, 1..1000 (default 10); applies to the
// next session. Returns LLAMA_INSTR_OK or ERR_INVALID_ARG.
LLAMA_API int32_t llama_instr_set_topk(int32_t k) LLAMA_INSTR_NOEXCEPT;

// Record the commands this process sends to RPC servers (ggml's RPC backend) while no session is
// open, from now until the next session begins, which writes them first as `transfers` records
// of phase "load": call it before loading a model to see its upload (LLAMA_INSTR_LOG does it when
// a program loads its first model). on = 0 stops and forgets them. Returns LLAMA_INSTR_OK, or
// ERR_INVALID_ARG when the build has no RPC backend.
LLAMA_API int32_t llama_instr_record_transfers(int32_t on) LLAMA_INSTR_NOEXCEPT;

// Write buffered lines to the log now. Returns LLAMA_INSTR_OK, ERR_NO_SESSION or ERR_IO.
LLAMA_API int32_t llama_instr_flush(void) LLAMA_INSTR_NOEXCEPT;

// Copy the path of the open (or last) session's log into `buf` (NUL-terminated, truncated to
// `buf_size`). Returns the full length of the path, like snprintf, or ERR_NO_SESSION if there was
// never a session.
LLAMA_API int32_t llama_instr_session_path(char * buf, size_t buf_size) LLAMA_INSTR_NOEXCEPT;

// Make devices behave as if they had only this much memory: "DEVICE=SIZE[,DEVICE=SIZE...]", with
// the device names ggml gives (CPU, Vulkan0, ...) and SIZE in bytes or with a K, M, G or T suffix
// (powers of 1024). A backend buffer that would take a device past its budget fails to allocate as
// it would on a device out of memory, and ggml's memory query (ggml_backend_dev_memory) reports at
// most the budget, so llama.cpp's own fitting sees it too. The budget is the process's, session or
// not; NULL or "" removes it. It replaces LLAMA_INSTR_MEMORY_BUDGET, which is read (the same way)
// at the first buffer the process makes. Returns LLAMA_INSTR_OK or ERR_INVALID_ARG (malformed, or
// a device that does not exist).
LLAMA_API int32_t llama_instr_set_memory_budget(const char * spec) LLAMA_INSTR_NOEXCEPT;

// The last backend buffer allocation that failed in this process, as a JSON object (the fields of
// a memory_alloc_failed record: device, purpose, bytes asked, bytes free, what each purpose held
// on the device), copied into `buf` as llama_instr_session_path does. Returns its full length, 0
// if no allocation has failed, or ERR_INTERNAL.
LLAMA_API int32_t llama_instr_memory_failure(char * buf, size_t buf_size) LLAMA_INSTR_NOEXCEPT;

// What llama.cpp itself says `ctx` and its model take (llama_get_memory_breakdown), as a JSON array
// of {"buffer_type", "device" (the ggml device whose memory it is; host buffers are the CPU's),
// "weights", "kv_cache", "compute"} in bytes, copied into `buf` as llama_instr_session_path does.
// A model and context made with no_alloc give llama.cpp's projection without allocating (what
// `instr fit` asks). Returns the full length, ERR_INVALID_ARG (ctx NULL) or ERR_INTERNAL.
LLAMA_API int32_t llama_instr_memory_breakdown(struct llama_context * ctx,
                                               char *                 buf,
                                               size_t                 buf_size) LLAMA_INSTR_NOEXCEPT;

// The node table of the graph `ctx` builds for a ubatch of `n_tokens` tokens with `n_outputs`
// outputs (1 <= n_outputs <= n_tokens), its KV cache at full size (the context's n_ctx cells), as
// ggml's scheduler splits it: a `graph` record (docs/schema.md) with graph id 0 and, per node, the
// device it runs on ("devices"), copied into `buf` as llama_instr_session_path does. The graph is
// built and split but never computed or allocated, so a model and context made with no_alloc (no
// weights read) give it: what `instr predict` costs a setting by. Returns the full length,
// ERR_INVALID_ARG (ctx NULL, or counts out of range) or ERR_INTERNAL (llama.cpp could not build
// it).
LLAMA_API int32_t llama_instr_graph_reserve(struct llama_context * ctx,
                                            int32_t                n_tokens,
                                            int32_t                n_outputs,
                                            char *                 buf,
                                            size_t                 buf_size) LLAMA_INSTR_NOEXCEPT;

// Totals of the open (or last) session. Returns LLAMA_INSTR_OK, ERR_NO_SESSION (never a session)
// or ERR_INVALID_ARG (NULL).
LLAMA_API int32_t llama_instr_session_totals(struct llama_instr_totals * totals) LLAMA_INSTR_NOEXCEPT;

// Tag the steps `ctx` decodes from its next llama_decode on with `request_id` (NULL or "" clears
// it), e.g. the HTTP request a server is answering: step_begin carries it as "request".
// Returns LLAMA_INSTR_OK, ERR_NO_SESSION or ERR_INVALID_ARG (NULL ctx, or longer than 128 bytes).
LLAMA_API int32_t llama_instr_set_request(struct llama_context * ctx, const char * request_id) LLAMA_INSTR_NOEXCEPT;

// ---- Always on: sampling, bounded files, every request (docs/schema.md) -----------------------

// Sampling, for the next session (only: llama_instr_session_begin consumes it): one decode step in `every_steps` is recorded at the session's
// level and the others at LLAMA_INSTR_LEVEL_MINIMAL (steps stay numbered; each step_begin says its
// level); with `every_requests` > 1, only the steps serving one request in `every_requests` (see
// llama_instr_request_begin) are, the others at MINIMAL. Both: a step is recorded in detail when
// it is one of the steps and serves one of the requests. 1 and 1 (the default) record every step.
// Returns LLAMA_INSTR_OK or ERR_INVALID_ARG (outside 1..1000000).
LLAMA_API int32_t llama_instr_set_sampling(int32_t every_steps, int32_t every_requests) LLAMA_INSTR_NOEXCEPT;

// Bounded files, for the next session (only, as sampling): once the log holds `max_bytes`, the files are rotated
// between two steps (LOG.keep is removed, LOG.N becomes LOG.N+1, LOG becomes LOG.1) and a new LOG
// begins with the session's session_start again (with "file":{"index":N,...}) and the graph
// tables its steps use, so that each file reads alone. A file may exceed max_bytes by one step's
// records. max_bytes 0 (the default) never rotates (keep must be 0 then); else max_bytes >= 65536
// and keep 1..1000. Returns LLAMA_INSTR_OK or ERR_INVALID_ARG.
LLAMA_API int32_t llama_instr_set_rotation(int64_t max_bytes, int32_t keep) LLAMA_INSTR_NOEXCEPT;

// Reopen the log at its path at the next step boundary (within about 50 ms when no step runs), as
// logrotate expects after it moved the file: the new file begins like a rotated one. It only sets
// a flag, so a signal handler may call it (a session opened by LLAMA_INSTR_LOG does so on SIGHUP).
// A failed write (a full disk) suspends writing, with one warning line on stderr and the log
// ending on a whole line, until the next rotation or reopen succeeds; the records dropped meanwhile
// are counted as lost.
LLAMA_API void llama_instr_reopen(void) LLAMA_INSTR_NOEXCEPT;

// A request begins on sequence `seq_id` of `ctx` (-1: on the whole context, as
// llama_instr_set_request tags its steps), for --sample-requests: requests are counted in the
// order they begin, and the steps serving one in every_requests are recorded in detail.
// Returns the level its steps are recorded at (LLAMA_INSTR_LEVEL_MINIMAL, or the level in force,
// llama_instr_set_level's, for a request sampled in), ERR_NO_SESSION or ERR_INVALID_ARG (NULL ctx, seq_id outside -1..65535).
LLAMA_API int32_t llama_instr_request_begin(struct llama_context * ctx, int32_t seq_id) LLAMA_INSTR_NOEXCEPT;

// The request on `seq_id` of `ctx` (-1: the whole context) ended. Returns LLAMA_INSTR_OK,
// ERR_NO_SESSION or ERR_INVALID_ARG.
LLAMA_API int32_t llama_instr_request_end(struct llama_context * ctx, int32_t seq_id) LLAMA_INSTR_NOEXCEPT;

// Write a record of the caller's own into the open session's log, for what the caller measures
// (a server's requests, say): {"type":"<type>","ts":<now, ns>,"sid":"...",<the members of
// fields_json>}. `type` is 1..32 characters of [a-z_]; `fields_json` a JSON object on one line, in
// UTF-8 (RFC 8259: no NaN), whose top-level keys, escapes decoded, must not be type, ts or sid. Returns LLAMA_INSTR_OK, ERR_NO_SESSION or
// ERR_INVALID_ARG (or ERR_INTERNAL, out of memory). A record refused while a session is open is counted
// in its lost records (totals.n_lost, session_end's "lost"): it was meant for the log.
LLAMA_API int32_t llama_instr_write_record(const char * type, const char * fields_json) LLAMA_INSTR_NOEXCEPT;

// The id `ctx` has in the open session's records (their "ctx"; reserved now for a context that has
// not decoded in this session yet), and in *last_step (when not NULL) the number of the last step
// it began in this session, or -1: what a program's own records link to its steps (llama-server's
// speculative decoding: a draft's steps and the target's step that verified them). Returns the id
// (>= 1), ERR_NO_SESSION (*last_step -1) or ERR_INVALID_ARG (ctx NULL).
LLAMA_API int32_t llama_instr_context_id(struct llama_context * ctx, int64_t * last_step) LLAMA_INSTR_NOEXCEPT;

// Capture node outputs while a session is open: from the next llama_decode of `ctx` on, the output
// of every graph node whose name matches one of `patterns` (exact, e.g. "l_out-3", or a prefix
// ending in '*', e.g. "l_out-*") is copied as F32 into memory the library owns, right after the
// op ran (by the CPU backend's worker threads; the graph is not split). n_patterns = 0 stops.
// Returns LLAMA_INSTR_OK, ERR_NO_SESSION or ERR_INVALID_ARG.
LLAMA_API int32_t llama_instr_capture(struct llama_context * ctx,
                                      const char * const *   patterns,
                                      int32_t                n_patterns) LLAMA_INSTR_NOEXCEPT;

// After a llama_decode with a capture set: the number of captured outputs (of its last ubatch).
//
// Threads and lifetime (llama_instr_captured_count and llama_instr_captured_get): unlike the rest
// of this API, call them only from the thread that decodes `ctx`, or from another thread that is
// synchronized with it (no llama_decode of `ctx` running meanwhile), between its decodes: the
// captured outputs belong to the last llama_decode of `ctx` and are replaced by its next one. They
// stay valid until then, or until `ctx` is freed; llama_instr_captured_get copies them, and the
// copies are the caller's.
LLAMA_API int32_t llama_instr_captured_count(struct llama_context * ctx) LLAMA_INSTR_NOEXCEPT;

// Captured output i: its node name (NUL-terminated, truncated to name_size), shape (ne[4]) and
// values (row-major, ne[0] fastest) copied to dst if dst_n is at least ne0*ne1*ne2*ne3.
// Returns the number of values, or ERR_INVALID_ARG.
LLAMA_API int64_t llama_instr_captured_get(struct llama_context * ctx,
                                           int32_t                i,
                                           char *                 name,
                                           size_t                 name_size,
                                           int64_t *              ne,
                                           float *                dst,
                                           int64_t                dst_n) LLAMA_INSTR_NOEXCEPT;

// ---- Between two steps: sampling and the program's own work (llama-instr-sampling.cpp) --------
//
// With a session open, a context's `host` record says what its host did after each step, before
// its next: each output's sampling (every sampler of the chain apart at DETAILED, one total per step
// at MINIMAL) and the program's own work, per sequence. llama_sampler_sample and every sampler
// chain record themselves; a program that samples otherwise (common's sampler) says which output
// it samples and times the parts outside the chain with these functions. With no session open each
// costs one relaxed atomic load.

enum llama_instr_part_kind {
    LLAMA_INSTR_PART_SAMPLER  = 0,  // a sampler of the chain, by llama_sampler_name (recorded by the chain)
    LLAMA_INSTR_PART_GRAMMAR  = 1,  // the grammar outside the chain: "check" (the sampled token), "full", "accept"
    LLAMA_INSTR_PART_SAMPLING = 2,  // the rest of a sampling: "candidates" (built from the logits), a sampler
                                    // applied outside the chain; "chain" (the chain's own time) is derived
    LLAMA_INSTR_PART_BACKEND  = 3,  // a sampler of the chain that ran in the graph (backend sampling, -bs)
    LLAMA_INSTR_PART_HOST     = 4,  // the program's own work: "detokenize", "stop", "response", "batch", ...
};

// Open the sampling of output `idx` of the last step of `ctx` (idx as llama_get_logits_ith takes
// it: a batch index, or negative from the last output) by `smpl` (its sampler chain, or NULL): the
// time until llama_instr_sample_end, and the parts recorded meanwhile on this thread, go to that
// step's window and the output's sequence. ctx NULL: the context and sequence `smpl` last sampled
// for on this thread (a token it accepts after sampling it). Scopes nest: only the outermost
// records. Returns a handle for llama_instr_sample_end, 0 when it records nothing.
LLAMA_API int64_t llama_instr_sample_begin(struct llama_context *       ctx,
                                           int32_t                      idx,
                                           const struct llama_sampler * smpl) LLAMA_INSTR_NOEXCEPT;

// The same for sequence `seq` of `ctx` (tokens its chain accepts before sampling, say); counts no
// output sampled.
LLAMA_API int64_t llama_instr_sample_begin_seq(struct llama_context *       ctx,
                                               int32_t                      seq,
                                               const struct llama_sampler * smpl) LLAMA_INSTR_NOEXCEPT;

// Close the scope of `handle` (0 does nothing).
LLAMA_API void llama_instr_sample_end(int64_t handle) LLAMA_INSTR_NOEXCEPT;

// The log's clock (ns) when the open scope on this thread times its parts (DETAILED), else 0.
LLAMA_API int64_t llama_instr_sample_clock(void) LLAMA_INSTR_NOEXCEPT;

// A part of the open scope's sampling, from `t_start` (llama_instr_sample_clock; 0 does nothing)
// until now: `kind` an enum llama_instr_part_kind, `name` a string that stays valid until the
// scope closes (at most 31 bytes are kept).
LLAMA_API void llama_instr_sample_part(int32_t kind, const char * name, int64_t t_start) LLAMA_INSTR_NOEXCEPT;

// The open scope's output was sampled in the graph (backend sampling): the samplers of `chain`
// that ran there are recorded as such.
LLAMA_API void llama_instr_sample_on_backend(const struct llama_sampler * chain) LLAMA_INSTR_NOEXCEPT;

// The log's clock (ns) when a session records, else 0: the start of a llama_instr_host_part.
LLAMA_API int64_t llama_instr_host_clock(void) LLAMA_INSTR_NOEXCEPT;

// The program's own work for sequence `seq` of `ctx` (-1: none in particular) between two steps,
// from `t_start` (llama_instr_host_clock; 0 does nothing) until now, named `name` (at most 31
// bytes are kept).
LLAMA_API void llama_instr_host_part(struct llama_context * ctx, int32_t seq, const char * name, int64_t t_start)
    LLAMA_INSTR_NOEXCEPT;

// Sequence `seq` of `ctx` serves the request `request_id` (NULL or "": none) from now on: its
// `host` records name it. Returns LLAMA_INSTR_OK, ERR_NO_SESSION or ERR_INVALID_ARG (NULL ctx,
// seq outside 0..65535, an id longer than 128 bytes).
LLAMA_API int32_t llama_instr_set_seq_request(struct llama_context * ctx,
                                              int32_t                seq,
                                              const char *           request_id) LLAMA_INSTR_NOEXCEPT;

// ---- Images and sounds (tools/mtmd; llama-instr-media.cpp) -------------------------------------
//
// mtmd's encoders (clip contexts: a vision or audio encoder and its projector) compute their graphs
// outside llama_decode. With a session open, each encoder is a context of its own (a `context`
// record with role "encoder") whose steps are its encodes (kind "encode"): every op of its graph
// timed by the backend that runs it, its blocks as layers. Each image or sound tokenized is a
// `media` record (its size, slices, tokens, a hash of its bytes, its load and preprocessing), and
// a step that decodes a medium's embeddings into the model names it. mtmd calls these; with no
// session open each costs a relaxed atomic load.

enum llama_instr_media_kind {
    LLAMA_INSTR_MEDIA_IMAGE = 0,
    LLAMA_INSTR_MEDIA_AUDIO = 1,
};

struct llama_instr_encoder_desc {
    const char * projector;   // the projector's type as clip names it ("idefics3", "ultravox", ...)
    int32_t      modality;    // enum llama_instr_media_kind
    int32_t      n_layer;     // the encoder's blocks
    int32_t      n_embd;      // its width
    int32_t      n_embd_out;  // the projector's output width (the language model's)
    int32_t      image_size;  // vision: the encoder's input side, in pixels (0: audio)
    int32_t      patch_size;  // vision: a patch's side, in pixels (0: audio)
};

// `encoder` (an address unique while it lives: its clip context) is described, whether or not a
// session is open: the `context` record of its first encode in each session says so. Returns
// LLAMA_INSTR_OK, ERR_INVALID_ARG (NULL) or ERR_INTERNAL.
LLAMA_API int32_t llama_instr_encoder_describe(const void *                            encoder,
                                               const struct llama_instr_encoder_desc * desc) LLAMA_INSTR_NOEXCEPT;

// `encoder` is freed (session or not): its state goes with it.
LLAMA_API void llama_instr_encoder_free(const void * encoder) LLAMA_INSTR_NOEXCEPT;

// What the backend buffers allocated on this thread from now on are for: 1 the weights of
// `encoder`, 2 its compute buffers; 0 ends the last 1 or 2 not ended yet, giving back what the
// buffers were for before it. Calls nest up to LLAMA_INSTR_ENCODER_NESTING deep (a 0 that ends one
// deeper, or ends none, gives back nothing of an encoder). A compute buffer names its encoder's
// context (and the encode's step, during one) as a llama_context's does. Always on, like the
// purposes of llama.cpp's own buffers.
#define LLAMA_INSTR_ENCODER_NESTING 8
LLAMA_API void llama_instr_encoder_buffers(const void * encoder, int32_t what) LLAMA_INSTR_NOEXCEPT;

// The log's clock (ns), whether or not a session is open.
LLAMA_API int64_t llama_instr_clock(void) LLAMA_INSTR_NOEXCEPT;

// The 64-bit hash a medium is named by in the log (never by its bytes): `media.hash` of a bitmap's
// bytes, and a request body's medium by its bytes as sent. Little-endian 8-byte words, each mixed
// in with a multiply; any n (data may be NULL when n is 0).
LLAMA_API uint64_t llama_instr_hash_bytes(const void * data, size_t n) LLAMA_INSTR_NOEXCEPT;

// A medium was loaded (decoded from its file or bytes) from `t_start` (llama_instr_clock; 0 does
// nothing) until now, into `bitmap`, whether or not a session is open (a program may load its
// media before it opens one): the medium made of it in a session says so.
LLAMA_API void llama_instr_media_loaded(const void * bitmap, int64_t t_start) LLAMA_INSTR_NOEXCEPT;

// `bitmap` is freed: a load noted of it and not claimed is dropped (a bitmap made later at the
// same address was loaded, if at all, by a call of its own).
LLAMA_API void llama_instr_media_unloaded(const void * bitmap) LLAMA_INSTR_NOEXCEPT;

struct llama_instr_media_desc {
    int32_t               kind;          // enum llama_instr_media_kind
    uint32_t              nx, ny;        // image: its pixels; audio: its samples, and 1
    int32_t               n_frames;      // bitmaps merged into it (video frames), at least 1
    const unsigned char * data;          // its bytes, hashed (never stored), or NULL
    size_t                n_bytes;       //
    int32_t               n_slices;      // encoder inputs it became (an overview and tiles, audio chunks)
    int32_t               n_tokens;      // the embeddings it costs the model
    int32_t               n_pos;         // the positions they take
    int64_t               t_preprocess;  // its preprocessing's start (llama_instr_host_clock); its end is now
    const void *          bitmap;        // the bitmap llama_instr_media_loaded named, or NULL
};

// A medium tokenized: its `media` record. Returns its id (> 0, unique in the process), 0 when no
// session records, or a negative llama_instr_status.
LLAMA_API int64_t llama_instr_media_add(const struct llama_instr_media_desc * desc) LLAMA_INSTR_NOEXCEPT;

// The next encode on this thread serves sequence `seq` of `ctx` (its request), until it begins.
LLAMA_API void llama_instr_media_for(struct llama_context * ctx, int32_t seq) LLAMA_INSTR_NOEXCEPT;

// The next encode on this thread encodes slices `slices[i]` of media `media[i]` (ids from
// llama_instr_media_add; 0: a medium no session recorded), `n_tokens` embeddings in all.
LLAMA_API void llama_instr_media_encoding(const int64_t * media, const int32_t * slices, int32_t n, int32_t n_tokens)
    LLAMA_INSTR_NOEXCEPT;

// An encode by `encoder` on this thread: begin (returns its start, 0 when it is not recorded),
// then the start of the graph's build (what the callback named before it, a warm-up's graphs built
// inside the encode, is not this graph's), the graph's callback as its builder names each block's
// tensors, the graph built (before the scheduler allocates it), its compute around
// ggml_backend_sched_graph_compute, and the end (`t_start` from begin; n_tokens embeddings of
// n_embd values made; status 0: done).
LLAMA_API int64_t llama_instr_encode_begin(const void * encoder, int32_t n_threads) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_graph_begin(const void * encoder) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_graph_cb(struct ggml_tensor * cur, int32_t il) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_graph_built(const void *         encoder,
                                                 ggml_backend_sched_t sched,
                                                 struct ggml_cgraph * gf) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_compute_begin(const void *         encoder,
                                                   ggml_backend_sched_t sched,
                                                   struct ggml_cgraph * gf) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_compute_end(const void * encoder, int32_t status) LLAMA_INSTR_NOEXCEPT;
LLAMA_API void    llama_instr_encode_end(const void * encoder,
                                         int64_t      t_start,
                                         int32_t      n_tokens,
                                         int32_t      n_embd,
                                         int32_t      status) LLAMA_INSTR_NOEXCEPT;

// The next steps of `ctx` decode the embeddings of slice `slice` of medium `media` (0: of none):
// their step_begin names it.
LLAMA_API void llama_instr_set_media(struct llama_context * ctx, int64_t media, int32_t slice) LLAMA_INSTR_NOEXCEPT;

// ---- The machine and its peaks (llama-instr-peaks.cpp) ----------------------------------------

// A JSON object naming this machine, the one session_start records as "machine":
// {"cpu":"<model>","n_cpus":<hardware threads>,"devices":[{"index":0,"name":"CPU",
// "description":"...","type":"cpu"|"gpu"|"igpu"|"accel","memory_total":<bytes>}, ...]}.
// Valid until this thread's next call of this function; "" if it could not be made.
LLAMA_API const char * llama_instr_machine_info(void);

enum llama_instr_probe_kind {
    LLAMA_INSTR_PROBE_BANDWIDTH = 0,  // c = a + b (GGML_OP_ADD) over three F32 buffers of `size` elements,
                                      // shaped [4096, size / 4096] so that the threads share the rows
    LLAMA_INSTR_PROBE_MATMUL    = 1,  // y = w x (GGML_OP_MUL_MAT): w [k = size, m] of `type` (m = 0: size),
                                      // x [k, n] F32, y [m, n] F32; `n_weights` such w, each its own,
                                      // times the one x, one after the other in one graph (a model's
                                      // layers: weights read cold, each op's start and end paid)
    LLAMA_INSTR_PROBE_ATTENTION = 2,  // one op of attention (`attn.op`) for n query rows over a KV
                                      // cache laid out as llama.cpp's, in attn.n_layer layers
};

// The op of an ATTENTION probe, with its sources as llama.cpp's graph has them (build_attn_mha):
// q [head_dim_k, n, n_head] F32 (a permuted view), the caches' views of n_kv cells, the causal mask
// [n_kv, n] (row i sees cells 0..pos0 + i), the scores [n_kv, n, n_head] F32.
enum llama_instr_probe_attn_op {
    LLAMA_INSTR_PROBE_ATTN_FLASH   = 0,  // GGML_OP_FLASH_ATTN_EXT (q, k, v, the mask in F16)
    LLAMA_INSTR_PROBE_ATTN_KQ      = 1,  // GGML_OP_MUL_MAT k q
    LLAMA_INSTR_PROBE_ATTN_SOFTMAX = 2,  // GGML_OP_SOFT_MAX of the scores with the mask
    LLAMA_INSTR_PROBE_ATTN_KQV     = 3,  // GGML_OP_MUL_MAT v (the transposed cache) by the scores
};

struct llama_instr_probe_attn {
    int32_t op;          // enum llama_instr_probe_attn_op
    int32_t type_k;      // ggml_type of the K cache
    int32_t type_v;      // ggml_type of the V cache
    int32_t head_dim_k;  // n_embd_head_k
    int32_t head_dim_v;  // n_embd_head_v
    int32_t n_head;      // query heads (a multiple of n_head_kv)
    int32_t n_head_kv;   // KV heads
    int32_t n_layer;     // the op once per layer, each on a cache of its own, in one graph (1..512)
    int64_t kv_size;     // cells of each cache (the context): a transposed V's row length
    int64_t n_kv;        // cells read (1..kv_size)
    int64_t pos0;        // position of the first query row (pos0 + n <= n_kv)
};

struct llama_instr_probe_tensor {
    int32_t type;    // ggml_type
    int64_t ne[4];   // ggml order, ne[0] innermost
    int64_t nbytes;  // ggml_nbytes
};

// One measurement of llama_instr_probe_run: fill the inputs (zero the rest), read the outputs.
struct llama_instr_probe {
    // inputs
    int32_t                       kind;       // enum llama_instr_probe_kind
    int32_t                       device;     // index of the backend device (the "index" in llama_instr_machine_info)
    int32_t                       type;       // MATMUL: ggml_type of w (F32, F16, Q4_K, Q8_0, ...); BANDWIDTH: ignored
    int32_t                       n_threads;  // CPU threads (<= 0: all hardware threads); other devices ignore it
    int64_t                       size;       // BANDWIDTH: elements per buffer (a multiple of 4096); MATMUL: k = m
    int64_t                       n;          // MATMUL: columns of x (tokens of a batch); BANDWIDTH: ignored
    int32_t                       n_runs;     // timed runs, after one untimed warm-up (1..1000)
    struct llama_instr_probe_attn attn;       // ATTENTION: the op and its shapes (n: the query rows)
    int64_t                       m;          // MATMUL: rows of w (0: size; up to 65536)
    int32_t                       n_weights;  // MATMUL: weights of that shape (0: 1; up to 4096, 4 GiB in all)
    int32_t                       n_threads_b;  // MATMUL on the CPU: a second thread count, its runs in turn
                                                // with n_threads' (0: none; other devices ignore it)
    // outputs
    char                          device_name[64];  // e.g. "CPU", "CUDA0"
    char    buffer_type[64];  // the buffer type that held w (the CPU's repacking one where a run uses it)
    int32_t n_tensors;        // tensors of the graph: the sources, then the output (MATMUL: the first w's)
    struct llama_instr_probe_tensor tensors[3];
    int64_t                         bytes;        // bytes one run moves as counted: the sum of the tensors' nbytes
                                                  // (MATMUL: each weight's and each output's)
    int64_t                         flops;        // FLOPs one run does: BANDWIDTH size; MATMUL 2 k m n n_weights;
                                                  // ATTENTION its layers' over the n_kv cells, masked or not
    int64_t                         best_ns;      // fastest timed run
    int64_t                         total_ns;     // all timed runs
    int64_t                         best_ns_b;    // at n_threads_b (0 without): fastest timed run
    int64_t                         total_ns_b;   // at n_threads_b: all timed runs
    int64_t                         median_ns;    // the median timed run (of an even count: the two
                                                  // middle runs' mean): a shared machine's usual speed
    int64_t                         median_ns_b;  // at n_threads_b (0 without): the median timed run
    char                            error[256];   // why it failed ("" on success)
};

// Build the probe's ggml graph on the device through ggml's backend API, fill its sources, run it
// once untimed and n_runs times timed (with n_threads_b: at each count, in turn), with the run's
// code paths (the CPU's extra buffer types where they take the op, as a llama_context does).
// Synchronous; safe from any thread; needs no session. Returns LLAMA_INSTR_OK, ERR_INVALID_ARG
// (NULL, kind, device, type, size, m, n, n_weights, n_threads_b, n_runs; attn: an op, type or
// shape out of range, or caches of more than 4 GiB in all) or ERR_INTERNAL (the device cannot
// allocate or run the graph); p->error then says why (llama_instr_last_error is not set by this
// function).
LLAMA_API int32_t llama_instr_probe_run(struct llama_instr_probe * p);

// What the last failing call on this thread reported ("" if none; at most 511 bytes). Valid until
// this thread's next call into this API, and in atexit handlers too.
LLAMA_API const char * llama_instr_last_error(void) LLAMA_INSTR_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif  // LLAMA_INSTR_H
