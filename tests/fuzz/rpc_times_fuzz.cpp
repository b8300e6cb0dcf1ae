// libFuzzer harness for the RPC client's reading of a server's block of op times
// (rpc_instr_parse_times, in the overlay's ggml-rpc/instr.cpp): the bytes come from the network,
// so no input may read or write out of bounds, overflow, or hand the profiler an op outside its
// graph. instr.cpp is included whole, so that the parser is compiled with the fuzzer's coverage
// and the sanitizers (tests/test_fuzz.py builds and runs it for a bounded time).
#include "instr.cpp"

#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    // the first bytes say how many graphs are pending (0..7) and the node count of each (0..65535)
    if (size < 1) {
        return 0;
    }
    const size_t n = data[0] % 8;
    data++;
    size--;
    uint32_t max_nodes[8] = {};
    for (size_t k = 0; k < n; k++) {
        if (size < 2) {
            return 0;
        }
        max_nodes[k] = (uint32_t) data[0] | ((uint32_t) data[1] << 8);
        data += 2;
        size -= 2;
    }
    uint32_t widest = 0;
    for (size_t k = 0; k < n; k++) {
        widest = std::max(widest, max_nodes[k]);
    }
    // the block in a buffer of its own size, so that any read past it is caught
    std::vector<uint8_t>             block_bytes(data, data + size);
    std::vector<ggml_rpc_profile_op> scratch(widest);
    rpc_instr_block                  block;
    const char * bad = rpc_instr_parse_times(block_bytes.data(), block_bytes.size(), max_nodes, n, block, nullptr,
                                             [](uint32_t, const rpc_instr_graph &, const ggml_rpc_profile_op *, uint32_t) {});
    if (bad) {
        return 0;
    }
    uint32_t seen = 0;
    const char * again = rpc_instr_parse_times(
        block_bytes.data(), block_bytes.size(), max_nodes, n, block, &scratch,
        [&](uint32_t k, const rpc_instr_graph &, const ggml_rpc_profile_op * ops, uint32_t n_ops) {
            if (k >= n || n_ops > max_nodes[k]) {
                fprintf(stderr, "graph %u: %u ops handed on for %u nodes\n", k, n_ops, k < n ? max_nodes[k] : 0);
                abort();
            }
            int64_t next = 0;
            for (uint32_t i = 0; i < n_ops; i++) {
                if (ops[i].node < 0 || ops[i].n_fused < 0 ||
                    (int64_t) ops[i].node + ops[i].n_fused >= (int64_t) max_nodes[k]) {
                    fprintf(stderr, "graph %u op %u: node %d + %d outside %u nodes\n", k, i, ops[i].node,
                            ops[i].n_fused, max_nodes[k]);
                    abort();
                }
                // no node named by two ops: the nodes a record lists stay within the graph's
                if (ops[i].node < next) {
                    fprintf(stderr, "graph %u op %u: node %d overlaps the op before it\n", k, i, ops[i].node);
                    abort();
                }
                next = (int64_t) ops[i].node + ops[i].n_fused + 1;
            }
            seen++;
        });
    if (again || seen != block.n_graphs) {
        fprintf(stderr, "a block accepted once was not read the same way again\n");
        abort();
    }
    return 0;
}
