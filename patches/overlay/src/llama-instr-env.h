#pragma once

// llamacpp-instr: a session opened by the environment, for programs that never call the API
// (llama-server, llama-cli, llama-bench, or any program linking libllama).
//
//   LLAMA_INSTR_LOG=path     open a session writing to `path` at the first context
//   LLAMA_INSTR_LEVEL=level  minimal, detailed (the default) or verbose
//   LLAMA_INSTR_TOPK=k       top logits per output row at the verbose level (1..1000)
//   LLAMA_INSTR_SAMPLE=n     one decode step in n at the level, the others at minimal
//   LLAMA_INSTR_SAMPLE_REQUESTS=n  the steps of one request in n at the level (llama-server)
//   LLAMA_INSTR_MAX_BYTES=size  rotate the log at this size (bytes, or with a K, M or G suffix)
//   LLAMA_INSTR_KEEP=k       rotated files kept: LOG.1 .. LOG.k (default 8)
//
// The session ends when the process exits normally (status "ok"), or "interrupted" once SIGINT
// or SIGTERM arrived. SIGHUP reopens the log at its path (logrotate). The program's own handlers keep working: ours only notes the signal and
// calls theirs (or, where the program left the default action, ends the session and then lets the
// signal kill the process as it would have). Bad values print one line on stderr and the
// program runs uninstrumented. Unset, the hook costs one relaxed atomic load per new context.

#include <cstdint>

struct llama_context;

// Called by llama.cpp before it loads a model: with LLAMA_INSTR_LOG set, the commands sent to RPC
// servers are recorded from here on for the session (llama_instr_record_transfers), so that its log
// holds the model's upload. Unset, it costs one relaxed atomic load per model.
void llama_instr_env_model_loading();

// Called by llama_init_from_model for each context it created; the first call reads the
// environment and may open the session.
void llama_instr_env_context_created(llama_context * ctx);

namespace llama_instr {

// The session's switches, read from the environment once per session (at its first compute or
// step that asks), never per compute: getenv scans the environment, and races a setenv on another
// thread. A program switches them between sessions.
//   LLAMA_INSTR_DEVICE_TIMING=0     the device's ops untimed (the scheduler's splits and copies
//                                   are still recorded)
//   LLAMA_INSTR_DEVICE_CLOCK=fence  the fenced clock pair even where the driver calibrates (tests)
//   LLAMA_INSTR_STEP_MEMORY=0       no step_end.memory (what the figures cost is measured against
//                                   it: bench/overhead.py)
//   LLAMA_INSTR_VALUE_STATS=1       at VERBOSE, each CPU op's output statistics (tensor_stats): the
//                                   threads read every output again once it is written, much of it
//                                   written by another core, which costs a generation step more
//                                   than the rest of VERBOSE together (bench/overhead.py)
struct device_env {
    bool timing      = true;
    bool clock_fence = false;
    bool step_memory = true;
    bool value_stats = false;
};

device_env env_device(uint64_t session_epoch);

}  // namespace llama_instr
