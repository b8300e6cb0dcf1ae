#include "llama-instr-model.h"

#include "ggml-backend.h"
#include "llama-context.h"
#include "llama-ext.h"
#include "llama-instr-graph.h"
#include "llama-instr-memory.h"
#include "llama-instr-rpc.h"
#include "llama-kv-cache-iswa.h"
#include "llama-kv-cache.h"
#include "llama-model.h"

#include <string>

namespace llama_instr {

static const char * rope_type_name(const llama_model & model) {
    switch (llama_model_rope_type(&model)) {
        case LLAMA_ROPE_TYPE_NORM:
            return "norm";
        case LLAMA_ROPE_TYPE_NEOX:
            return "neox";
        case LLAMA_ROPE_TYPE_MROPE:
            return "mrope";
        case LLAMA_ROPE_TYPE_VISION:
            return "vision";
        default:
            return "none";
    }
}

// "model": what the model is (its architecture, shapes, rope, file type and size)
static void write_model(json_out & j, const llama_model & model) {
    const auto & hp = model.hparams;

    char sbuf[256];
    auto meta = [&](const char * key) -> std::string {
        const int n = llama_model_meta_val_str(&model, key, sbuf, sizeof(sbuf));
        return n >= 0 ? std::string(sbuf) : std::string();
    };

    j.key("model");
    j.ch('{');
    j.key("architecture");
    j.str(model.arch_name());
    j.key("name");
    j.str(meta("general.name"));
    j.key("n_layer");
    j.i64(hp.n_layer());
    j.key("n_embd");
    j.i64(hp.n_embd);
    j.key("n_head");
    j.i64(hp.n_head(0));
    j.key("n_head_kv");
    j.i64(hp.n_head_kv(0));
    j.key("n_ff");
    j.i64(hp.n_ff(0));
    j.key("n_vocab");
    j.i64(llama_vocab_n_tokens(llama_model_get_vocab(&model)));
    j.key("n_ctx_train");
    j.i64(hp.n_ctx_train);
    j.key("rope");
    j.ch('{');
    j.key("type");
    j.str(rope_type_name(model));
    j.key("freq_base");
    j.f64(hp.rope_freq_base_train);
    j.key("freq_scale");
    j.f64(hp.rope_freq_scale_train);
    j.ch('}');
    j.key("file_type");
    j.str(llama_ftype_name(llama_model_ftype(&model)));
    j.key("n_params");
    j.i64((int64_t) llama_model_n_params(&model));
    j.key("size_bytes");
    j.i64((int64_t) llama_model_size(&model));
    j.ch('}');
}

// the context's KV cache of one type for K and V: a plain cache, or an iSWA one's base cache
static const llama_kv_cache * kv_cache_of(llama_context * ctx) {
    auto * mem = ctx->get_memory();
    if (!mem) {
        return nullptr;
    }
    if (const auto * kv = dynamic_cast<const llama_kv_cache *>(mem)) {
        return kv;
    }
    if (auto * iswa = dynamic_cast<const llama_kv_cache_iswa *>(mem)) {
        return iswa->get_base();
    }
    return nullptr;
}

// "context": the parameters the context was made with, and its KV cache's types
static void write_context_params(json_out & j, llama_context * ctx) {
    const auto & cp = ctx->get_cparams();
    j.key("context");
    j.ch('{');
    j.key("n_ctx");
    j.i64(cp.n_ctx);
    j.key("n_batch");
    j.i64(cp.n_batch);
    j.key("n_ubatch");
    j.i64(cp.n_ubatch);
    j.key("n_seq_max");
    j.i64(cp.n_seq_max);
    j.key("n_threads");
    j.i64(cp.n_threads);
    j.key("n_threads_batch");
    j.i64(cp.n_threads_batch);
    j.key("flash_attn");
    j.boolean(cp.flash_attn);
    const llama_kv_cache * kv = kv_cache_of(ctx);
    j.key("type_k");
    j.str(kv ? ggml_type_name(kv->type_k()) : "none");
    j.key("type_v");
    j.str(kv ? ggml_type_name(kv->type_v()) : "none");
    j.ch('}');
}

// "weights": one row per tensor of the model, by name
static void write_weights(json_out & j, const llama_model & model) {
    j.key("weights");
    j.ch('[');
    for (const auto & [name, t] : model.tensors_by_name) {
        j.sep();
        j.ch('{');
        j.key("name");
        j.str(name);
        j.key("type");
        j.str(ggml_type_name(t->type));
        j.key("type_id");
        j.i64((int64_t) t->type);
        j.key("shape");
        j.shape(t);
        j.key("n_elements");
        j.i64(ggml_nelements(t));
        j.key("bytes");
        j.i64((int64_t) ggml_nbytes(t));
        j.key("layer");
        const int32_t il = layer_from_name(name.c_str(), "blk.");
        if (il >= 0) {
            j.i64(il);
        } else {
            j.raw("null");
        }
        j.key("buffer");
        j.str(t->buffer ? ggml_backend_buffer_name(t->buffer) : "none");
        j.ch('}');
    }
    j.ch(']');
}

// "memory": the totals, then the buffers' rows they sum
static void write_memory(json_out & j, llama_context * ctx) {
    // the totals follow the rows they sum in the record, as they always have: the rows are
    // written first, then moved behind them
    j.key("memory");
    std::string            rows;
    json_out               r{ rows };
    const breakdown_totals t = write_memory_breakdown(r, ctx, false);
    j.ch('{');
    j.key("weights");
    j.i64(t.weights);
    j.key("kv_cache");
    j.i64(t.kv_cache);
    j.key("compute");
    j.i64(t.compute);
    j.key("buffers");
    j.ch('[');
    j.raw(rows);
    j.ch(']');
    j.ch('}');
}

void write_model_info(json_out & j, llama_context * ctx) {
    const llama_model & model = ctx->get_model();
    write_model(j, model);
    write_context_params(j, ctx);
    write_weights(j, model);
    write_memory(j, ctx);
}

void write_devices(json_out & j) {
    j.key("devices");
    j.ch('[');
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev  = ggml_backend_dev_get(i);
        size_t             free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        const char * type = "other";
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU:
                type = "cpu";
                break;
            case GGML_BACKEND_DEVICE_TYPE_GPU:
                type = "gpu";
                break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU:
                type = "igpu";
                break;
            case GGML_BACKEND_DEVICE_TYPE_ACCEL:
                type = "accel";
                break;
            default:
                break;
        }
        j.sep();
        j.ch('{');
        j.key("index");
        j.i64((int64_t) i);
        j.key("name");
        j.str(ggml_backend_dev_name(dev));
        j.key("backend");
        j.str(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)));
        j.key("description");
        j.str(ggml_backend_dev_description(dev));
        j.key("type");
        j.str(type);
        j.key("memory_total");
        j.i64((int64_t) total);
        j.key("memory_free");
        j.i64((int64_t) free);
        // an RPC device: does its server time the graphs it computes (a patched server), or are its
        // splits timed on this host only (a stock one)?
        const int32_t remote = rpc_remote_timing(dev);
        if (remote >= 0) {
            j.key("remote_timing");
            j.boolean(remote == 1);
        }
        j.ch('}');
    }
    j.ch(']');
}

}  // namespace llama_instr
