"""The MoE test models (tests/helpers/moe_gguf.py) are what they claim, checked apart from llama.cpp's
reading of them: the file's keys and bytes with gguf-py. (The identical-experts model's text
against the dense model it was made from, at every level: test_moe_route.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

pytestmark = pytest.mark.native


def _tensors(path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def test_the_small_moe_stacks_other_layers_ffns_as_its_experts(
    moe_small: Path, smollm2_path: Path
) -> None:
    r = gguf.GGUFReader(str(moe_small))
    assert r.fields["llama.block_count"].contents() == 4
    assert r.fields["llama.expert_count"].contents() == 8
    assert r.fields["llama.expert_used_count"].contents() == 2
    moe, dense = _tensors(moe_small), _tensors(smollm2_path)
    assert not any(n.startswith("blk.4.") for n in moe)
    for il in range(4):
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            exps = np.asarray(moe[f"blk.{il}.{part}_exps.weight"].data)
            assert exps.shape[0] == 8
            for e in range(8):
                src = np.asarray(dense[f"blk.{(il + e) % 4}.{part}.weight"].data)
                assert np.array_equal(exps[e], src)
        router = np.asarray(moe[f"blk.{il}.ffn_gate_inp.weight"].data)
        assert router.shape == (8, r.fields["llama.embedding_length"].contents())
        norms = np.linalg.norm(router, axis=1)
        assert np.all(np.diff(norms) > 0)  # skewed: each row's spread above the last
