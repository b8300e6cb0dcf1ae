// An encoder's layers from clip's callback (encoder_layers): the il sequences below are those
// clip's graphs name, read from tools/mtmd at the pin (a ViT, the conformer of lfm2a, whisper with
// glma's projector, minicpmv's merger between two ranges of blocks, gemma3nv naming none).
// tests/test_native_units.py builds it against the patched tree and links it to libllama.
#include "check.h"
#include "llama-instr-graph.h"

#include <cstdio>
#include <vector>

using il_list = std::vector<std::pair<const ggml_tensor *, int32_t>>;

static il_list named(const std::vector<int32_t> & ils) {
    il_list out;
    for (int32_t il : ils) {
        out.emplace_back(nullptr, il);
    }
    return out;
}

static std::vector<int32_t> layers(const std::vector<int32_t> & ils, int32_t n_layer) {
    il_list l = named(ils);
    llama_instr::encoder_layers(l, n_layer);
    std::vector<int32_t> out;
    for (const auto & p : l) {
        out.push_back(p.second);
    }
    return out;
}

int main() {
    using v = std::vector<int32_t>;
    // build_vit: patches and positions, three blocks of several names each, the projector unnamed
    // but for its result
    CHECK(layers(v{ -1, -1, 0, 0, 0, 1, 1, 2, 2, -1 }, 3) == (v{ -1, -1, 0, 0, 0, 1, 1, 2, 2, 3 }));
    // conformer (lfm2a): the pre-encoder names its convolutions 0, 2, 3, 5, 6; two blocks; the
    // adapter names its module 0, then the projected result
    CHECK(layers(v{ 0, 2, 3, 5, 6, -1, -1, 0, 0, 1, 1, 0, -1 }, 2) ==
          (v{ -1, -1, -1, -1, -1, -1, -1, 0, 0, 1, 1, 2, 2 }));
    // whisper's encoder with glma's projector: its feed-forward built with il 0 after the blocks
    CHECK(layers(v{ -1, 0, 0, 1, 1, 2, -1, 0, 0, -1 }, 3) == (v{ -1, 0, 0, 1, 1, 2, 3, 3, 3, 3 }));
    // minicpmv: blocks 0-1, the merger (named without a layer), blocks 2-3
    CHECK(layers(v{ -1, 0, 1, -1, -1, 2, 3, -1 }, 4) == (v{ -1, 0, 1, 4, 4, 2, 3, 4 }));
    // a projector past n_layer's blocks (llava's feature layer taken from a deeper block than
    // n_layer counts): the projector follows the last block
    CHECK(layers(v{ 0, 1, 2, 3, -1 }, 2) == (v{ 0, 1, 2, 3, 4 }));
    // gemma3nv names nothing with a layer: nothing changes
    CHECK(layers(v{ -1, -1, -1 }, 4) == (v{ -1, -1, -1 }));
    CHECK(layers(v{}, 4).empty());
    // of two runs the longer is the blocks, the first of two as long
    CHECK(layers(v{ 0, 1, -1, 0, 1, 2 }, 3) == (v{ -1, -1, -1, 0, 1, 2 }));
    CHECK(layers(v{ 0, 1, 0, 1 }, 2) == (v{ 0, 1, 2, 2 }));
    printf("ok\n");
    return 0;
}
