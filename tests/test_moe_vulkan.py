"""Issue 52 §2, §4 on Vulkan (lavapipe): a mixture of experts' routing recorded where the router runs
on the device, read back with the commands that compute it (no synchronization per layer), and
with the experts on the CPU, what the scheduler copied for each layer.

Checked against facts computed apart: upstream's eval callback (cb_eval) reading every router's
ranking from the device in the same run, the same build's logits without a session, the GGUF's
expert sizes and ggml's rule for copying the experts a ubatch used (ggml-backend.cpp: consecutive
experts in one copy, plus up to 512 bytes after a group that is not the last expert)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from helpers.support import PROMPT, by_type, instr, read_log
from helpers.vulkan_backend import vulkan_device, vulkan_env

pytestmark = pytest.mark.vulkan

N_EXPERT, N_USED, N_LAYER = 8, 2, 4

# the child: llama.cpp's C API on the Vulkan build, every layer offloaded (the experts of the first
# `ncmoe` layers on the CPU), a session at `level` (none: "off"), greedy decoding; with `peer`, an
# eval callback reads every ffn_moe_argsort-<il> from the device (its first N_USED ids per row)
CHILD = r"""
import ctypes, json, re, sys
from pathlib import Path
import numpy as np, llama_cpp
import llama_cpp.llama_cpp as lc
from llamacpp_instr.native import bindings
from llamacpp_instr.running.tensor_overrides import TensorOverrides
model, log, level, peer, ncmoe, prompt, n_gen, out = sys.argv[1:9]
base = ctypes.CDLL(str(Path(lc._lib._name).parent / "libggml-base.so"))
base.ggml_get_name.restype = ctypes.c_char_p
base.ggml_get_name.argtypes = [ctypes.c_void_p]
base.ggml_nbytes.restype = ctypes.c_size_t
base.ggml_nbytes.argtypes = [ctypes.c_void_p]
base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
class Head(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4)]
NAME = re.compile(r"^ffn_moe_argsort-(\d+)$")
decodes = []
def on_eval(t, ask, _u):
    m = NAME.match((base.ggml_get_name(t) or b"").decode())
    if ask or m is None:
        return ask and m is not None
    h = ctypes.cast(t, ctypes.POINTER(Head)).contents
    n = int(base.ggml_nbytes(t))
    buf = (ctypes.c_char * n)()
    base.ggml_backend_tensor_get(t, buf, 0, n)
    ids = np.frombuffer(buf, np.int32).reshape(int(h.ne[1]), int(h.ne[0]))[:, :2]
    for e in ids.ravel():
        decodes[-1][f"{m.group(1)},{int(e)}"] = decodes[-1].get(f"{m.group(1)},{int(e)}", 0) + 1
    return True
cb = llama_cpp.ggml_backend_sched_eval_callback(on_eval)
mp = llama_cpp.llama_model_default_params()
mp.n_gpu_layers = 99
with TensorOverrides.from_options(n_cpu_moe=int(ncmoe) or None).loading():
    mdl = lc.llama_model_load_from_file(model.encode(), mp)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 64, 2, 2
cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as instr run's Llama
if peer == "1":
    cp.cb_eval = cb
ctx = llama_cpp.llama_init_from_model(mdl, cp)
api = bindings.load()
if level != "off":
    api.session_begin(ctx, log, level, {})
vocab = llama_cpp.llama_model_get_vocab(mdl)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
toks = (llama_cpp.llama_token * 64)()
n = llama_cpp.llama_tokenize(vocab, prompt.encode(), len(prompt.encode()), toks, 64, True, False)
batch = list(toks[:n])
rows = []
for _ in range(int(n_gen) + 1):
    arr = (llama_cpp.llama_token * len(batch))(*batch)
    decodes.append({})
    assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr))) == 0
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    rows.append(row)
    batch = [int(np.argmax(row))]
if level != "off":
    api.session_end("ok")
np.save(out + ".npy", np.stack(rows))
Path(out + ".json").write_text(json.dumps(decodes))
"""

LONG = " ".join([PROMPT] * 8)  # 40 tokens or more: ggml offloads the experts' matmuls of it


def _child(model: Path, out: Path, level: str, peer: bool, ncmoe: int = 0, prompt: str = PROMPT,
           n_gen: int = 3) -> tuple[np.ndarray, list[dict[str, int]]]:  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(out) + ".log", level, "1" if peer else "0",
         str(ncmoe), prompt, str(n_gen), str(out)],
        capture_output=True, text=True, env=vulkan_env(), timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(str(out) + ".npy"), json.loads(Path(str(out) + ".json").read_text())


def _logged(log: Path) -> list[Counter[tuple[int, int]]]:
    recs = read_log(log)
    steps = [r["step"] for r in by_type(recs, "step_begin")]
    out: dict[int, Counter[tuple[int, int]]] = {s: Counter() for s in steps}
    for r in by_type(recs, "experts"):
        for layer, e, tokens, w in r["rows"]:
            assert w is None  # the device's ranking is read, not its probabilities
            out[r["step"]][(layer, e)] += tokens
    return [out[s] for s in steps]


@pytest.mark.parametrize("ncmoe", [0, 2])
def test_routing_on_the_device_equals_the_eval_callbacks(
    ncmoe: int, moe_small: Path, tmp_path: Path
) -> None:
    vulkan_device()
    _, peer = _child(moe_small, tmp_path / "peer", "detailed", True, ncmoe)
    logged = _logged(tmp_path / "peer.log")
    assert len(logged) == len(peer) == 4
    for mine, theirs in zip(logged, peer, strict=True):
        want = Counter({tuple(map(int, k.split(","))): v for k, v in theirs.items()})
        assert mine == want
        assert sorted({la for la, _ in mine}) == list(range(N_LAYER))


def test_logits_are_bit_identical_with_routing_read_on_the_device(
    moe_small: Path, tmp_path: Path
) -> None:
    vulkan_device()
    off, _ = _child(moe_small, tmp_path / "off", "off", False)
    for level in ("minimal", "detailed", "verbose"):
        on, _ = _child(moe_small, tmp_path / level, level, False)
        assert off.tobytes() == on.tobytes(), level
        logged = _logged(tmp_path / f"{level}.log")
        if level == "minimal":
            assert not any(logged)
            continue
        # every step: each layer's tokens went to N_USED experts each (the fused router's ids)
        for step in logged[1:]:
            per_layer: Counter[int] = Counter()
            for (layer, _), n in step.items():
                per_layer[layer] += n
            assert per_layer == Counter({la: N_USED for la in range(N_LAYER)})
    recs = by_type(read_log(tmp_path / "verbose.log"), "experts")
    for r in recs:
        per: Counter[tuple[int, int]] = Counter()
        for layer, n_used, ids, _ in r["tokens"]:
            assert n_used == N_USED
            per.update((layer, e) for e in ids)
        assert per == Counter({(la, e): t for la, e, t, _ in r["rows"]})


def _expert_copy_bytes(used: set[int], expert_bytes: int) -> int:
    """ggml's copy of the experts a ubatch used (ggml_backend_sched_compute_splits): each run of
    consecutive experts at once, with min(expert_bytes, 512) more after a run that does not end at
    the last expert."""
    total, ids = 0, sorted(used)
    k = 0
    while k < len(ids):
        j = k
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        total += (ids[j] - ids[k] + 1) * expert_bytes
        total += min(expert_bytes, 512) if ids[j] < N_EXPERT - 1 else 0
        k = j + 1
    return total


def test_experts_on_the_cpu_copies_and_op_offload_per_layer(
    moe_small: Path, tmp_path: Path
) -> None:
    import gguf

    vulkan_device()
    log = tmp_path / "ncmoe2"
    _child(moe_small, log, "detailed", False, ncmoe=2, prompt=LONG, n_gen=2)
    recs = read_log(Path(str(log) + ".log"))
    size = {
        t.name: int(t.n_bytes) // N_EXPERT
        for t in gguf.GGUFReader(str(moe_small)).tensors
        if t.name.endswith("_exps.weight")
    }
    used: dict[tuple[int, int, int], set[int]] = defaultdict(set)
    for r in by_type(recs, "experts"):
        for layer, e, tokens, _ in r["rows"]:
            if tokens:
                used[(r["step"], r["ubatch"], layer)].add(e)
    prompt_step = by_type(recs, "step_begin")[0]
    assert prompt_step["n_tokens"] >= 32
    offloaded = 0
    for c in by_type(recs, "compute"):
        for copy in c.get("copies") or []:
            name, n = copy[2], copy[3]
            if not (name.startswith("blk.") and "_exps" in name):
                continue
            layer = int(name.split(".")[1])
            assert layer < 2  # only the layers whose experts are held on the CPU
            offloaded += 1
            want = _expert_copy_bytes(used[(c["step"], c["ubatch"], layer)], size[name])
            assert n == want, (name, n, want)
    assert offloaded == 3 * 2  # the prompt's expert matmuls of layers 0 and 1, run on Vulkan0
    out = instr("experts", str(log) + ".log", "--format", "json")
    assert out.returncode == 0, out.stderr
    moved = json.loads(out.stdout)["copies_by_layer"]
    assert {m["layer"] for m in moved} == {0, 1}
    gen = [m for m in moved if m["kind"] == "gen" and m["route"] == "Vulkan0 -> CPU"]
    # a generated token's activations and ids go to the CPU for each of those layers
    assert sorted(m["layer"] for m in gen) == [0, 1]
    prompt = [m for m in moved if m["kind"] == "prompt" and m["expert_weight_bytes_per_step"]]
    assert prompt and all(0 < m["expert_weight_share"] <= 1.01 for m in prompt)
