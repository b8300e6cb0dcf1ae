#pragma once

// llamacpp-instr: compute records. compute_begin arms the scheduler's profiler (splits, copies) and
// every backend's op timer (llama-instr-ops.h), compute_end collects what they measured into the
// step's records, and write_step_computes formats them (compute and tensor_stats records) once the
// step's end time is taken.

#include "llama-instr-session.h"

namespace llama_instr {

// the graph tables captured in the step, then its compute (and tensor_stats) records; emitted
// in that order and cleared
void write_step_computes(ctx_state & st);

}  // namespace llama_instr
