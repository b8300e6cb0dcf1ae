#pragma once

// llamacpp-instr: where every backend buffer lives and what it is for, the memory budget, and the
// memory figures of each step.
//
// ggml reports every buffer it makes and frees to an observer (ggml_backend_set_buffer_observer,
// set when libllama loads), and llama.cpp says what the buffers it is about to allocate are for
// (llama_instr_purpose_scope, llama-instr-hooks.h). The table of live buffers is kept whether or
// not a session is open: buffers are made a few dozen times per model and context, never per
// node, and a session that begins after the model loaded still starts with all of them. While a
// session is open each buffer made or freed is a record (memory_alloc, memory_free), and so is
// every allocation that fails (memory_alloc_failed), before llama.cpp gives up.

#include "llama-instr-json.h"

#include <cstdint>
#include <string>
#include <vector>

struct llama_context;

namespace llama_instr {

// The live buffers as memory_alloc records of session `sid` (at session_start and at the start of
// each new file of the session). With S().mtx held.
void memory_snapshot_lines(const std::string & sid, std::vector<std::string> & out);

// A step's memory figures, as step_end's "memory" member: the process's resident memory (file
// backed and anonymous), each KV cache's cells used and allocated, and each device's free memory
// as ggml reports it (the budget applied; null for an RPC device, whose query is a round trip).
void write_step_memory(json_out & j, const llama_context * ctx);

// What llama_get_memory_breakdown(ctx) says, summed over its buffer types.
struct breakdown_totals {
    int64_t weights  = 0;
    int64_t kv_cache = 0;
    int64_t compute  = 0;
};

// llama_get_memory_breakdown(ctx) as JSON rows (inside the caller's brackets), one per buffer
// type with its weights, kv_cache and compute bytes, named under "buffer" (session_start's
// memory.buffers) or, with_device, under "buffer_type" beside the "device" whose memory it is
// (llama_instr_memory_breakdown). Returns the totals.
breakdown_totals write_memory_breakdown(json_out & j, const llama_context * ctx, bool with_device);

// llama_get_memory_breakdown(ctx) as a JSON array (llama_instr_memory_breakdown).
std::string memory_breakdown_json(const llama_context * ctx);

// The last allocation that failed, as a JSON object ("" if none).
std::string memory_last_failure();

// How many KV caches and recurrent states the table knows (llama_instr_test_memory_caches): one
// per live cache, none once its last buffer is freed.
size_t memory_caches_known();

// Parse and set the budget ("DEVICE=SIZE[,DEVICE=SIZE...]", SIZE in bytes or with a K, M, G or T
// suffix of 1024; "" clears it). False with `why` set when it is malformed or names no device.
bool memory_set_budget(const char * spec, std::string & why);

}  // namespace llama_instr
