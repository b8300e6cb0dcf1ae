#pragma once

// llamacpp-instr: llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) decodes a llama_batch_ext
// without going through llama_decode, where the step hooks are (llama-server, llama-cli and
// llama-bench decode this way). With a session open, llama_process calls this instead of
// ctx->decode: it shows the hooks the batch as a llama_batch and decodes it between them.

#include <cstdint>

struct llama_context;
struct llama_batch_ext;

int32_t llama_instr_process_decode(llama_context * ctx, llama_batch_ext & batch);
