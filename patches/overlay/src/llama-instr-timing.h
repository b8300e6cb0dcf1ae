#pragma once

// llamacpp-instr: op timing. compute_begin hands the CPU backend a profiler, compute_end copies
// what it measured into the step's records, and write_step_computes formats them (compute and
// tensor_stats records) once the step's end time is taken.

#include "llama-instr-session.h"

namespace llama_instr {

// the graph tables captured in the step, then its compute (and tensor_stats) records; emitted
// in that order and cleared
void write_step_computes(ctx_state & st);

}  // namespace llama_instr
