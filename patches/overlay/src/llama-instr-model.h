#pragma once

// llamacpp-instr: what session_start says about the model and the context.

#include "llama-instr-json.h"

struct llama_context;

namespace llama_instr {

// "model", "context", "weights" and "memory" fields of session_start
void write_model_info(json_out & j, llama_context * ctx);

// the "devices" field of session_start.machine: every device of ggml's registry, in its order
// (splits and copies name devices by this index)
void write_devices(json_out & j);

}  // namespace llama_instr
