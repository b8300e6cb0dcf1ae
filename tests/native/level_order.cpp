// The level and its change count as the compiler sees them (issue 55 §1): the two inline functions
// of llama-instr-hooks.h, kept out of line so that tests/test_native_units.py can read their
// memory orders in the LLVM IR clang makes of this file.
#include "llama-instr-hooks.h"

extern "C" __attribute__((noinline)) int32_t level_writer(int32_t level) {
    return llama_instr_level_exchange(level);
}

extern "C" __attribute__((noinline)) uint64_t level_reader() {
    return llama_instr_level_changes_seen();
}
