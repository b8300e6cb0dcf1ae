#pragma once

// llamacpp-instr: what session_start says about the model and the context.

#include "llama-instr-json.h"

struct llama_context;

namespace llama_instr {

// "model", "context", "weights" and "memory" fields of session_start
void write_model_info(json_out & j, llama_context * ctx);

}  // namespace llama_instr
