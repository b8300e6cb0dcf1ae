#include "llama-instr-ops.h"

#include "llama-instr-session.h"

#include <cstring>

using namespace llama_instr;

std::unique_ptr<op_timer> llama_instr::make_op_timer(ggml_backend_t backend) {
    using make_fn = std::unique_ptr<op_timer> (*)(ggml_backend_t, ggml_backend_reg_t, int32_t);

    static const struct {
        const char * reg;  // ggml_backend_reg_name
        make_fn      make;
    } timers[] = {
        { "CPU",    make_cpu_op_timer  },
        { "RPC",    make_rpc_op_timer  },
        { "Vulkan", make_vk_op_timer   },
        { "CUDA",   make_cuda_op_timer },
    };

    const ggml_backend_dev_t dev = backend ? ggml_backend_get_device(backend) : nullptr;
    const ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg) {
        return nullptr;
    }
    for (const auto & t : timers) {
        if (strcmp(ggml_backend_reg_name(reg), t.reg) == 0) {
            return t.make(backend, reg, device_index(backend));
        }
    }
    return nullptr;
}

int32_t llama_instr::device_index(ggml_backend_t backend) {
    const ggml_backend_dev_t dev = backend ? ggml_backend_get_device(backend) : nullptr;
    for (size_t i = 0; dev && i < ggml_backend_dev_count(); i++) {
        if (ggml_backend_dev_get(i) == dev) {
            return (int32_t) i;
        }
    }
    return -1;
}

int32_t node_map::find(ctx_state & st, size_t k, const ggml_tensor * t) {
    if (gen != st.graph_gen) {
        // llama.cpp rebuilds graphs in the same memory: an entry of another graph may match
        ptr.clear();
        idx.clear();
        gen = st.graph_gen;
    }
    if (k < ptr.size() && ptr[k] == t) {
        return idx[k];
    }
    const int32_t i = st.graph.find(t);
    if (k >= ptr.size()) {
        ptr.resize(k + 1, nullptr);
        idx.resize(k + 1, -1);
    }
    ptr[k] = t;
    idx[k] = i;
    return i;
}

void llama_instr::append_layer_spans(ctx_state & st, size_t op_begin, size_t op_end) {
    layer_rec cur = {};
    cur.layer     = -1;
    for (size_t k = op_begin; k < op_end; k++) {
        const op_rec & op = st.p_ops[k];
        if (op.layer < 0) {
            continue;
        }
        if (op.layer != cur.layer) {
            if (cur.n_ops > 0) {
                st.p_layers.push_back(cur);
            }
            cur         = {};
            cur.layer   = op.layer;
            cur.device  = op.device;
            cur.t_start = op.t_start;
        }
        cur.t_end = op.t_end;
        cur.n_ops++;
    }
    if (cur.n_ops > 0) {
        st.p_layers.push_back(cur);
    }
}
