#pragma once

// llamacpp-instr: the machine's identity (session_start's "machine") and its measured peaks
// (llama_instr_probe), so that a log's ops can be set against this machine's roofs.

#include "llama-instr-json.h"

namespace llama_instr {

// "machine" field of session_start: the CPU model, its hardware threads and every backend device
// of the build (name, description, type, memory).
void write_machine_info(json_out & j);

}  // namespace llama_instr
