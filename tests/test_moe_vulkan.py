"""Issue 52 §2, §4 on Vulkan (lavapipe): a mixture of experts' routing recorded where the router runs
on the device, read back with the commands that compute it (no synchronization per layer), and
with the experts on the CPU, what the scheduler copied for each layer.

Checked against facts computed apart: upstream's eval callback (cb_eval) reading every router's
ranking from the device in the same run, the same build's logits without a session, the GGUF's
expert sizes and ggml's rule for copying the experts a ubatch used (ggml-backend.cpp: consecutive
experts in one copy, plus up to 512 bytes after a group that is not the last expert)."""

from __future__ import annotations

import json
import re
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
# eval callback reads every ffn_moe_argsort-<il> from the device (its first N_USED ids per row);
# with `warm`, the prompt and one token decoded before the session and forgotten (every pipeline
# the session's computes use created beforehand)
CHILD = r"""
import ctypes, json, re, sys
from pathlib import Path
import numpy as np, llama_cpp
import llama_cpp.llama_cpp as lc
from llamacpp_instr.native import bindings
from llamacpp_instr.running import tensor_buffers
from llamacpp_instr.running.tensor_overrides import TensorOverrides
model, log, level, peer, ncmoe, prompt, n_gen, out, warm = sys.argv[1:10]
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
with tensor_buffers.loading(TensorOverrides.from_options(n_cpu_moe=int(ncmoe) or None)):
    mdl = lc.llama_model_load_from_file(model.encode(), mp)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 64, 2, 2
cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as instr run's Llama
if peer == "1":
    cp.cb_eval = cb
ctx = llama_cpp.llama_init_from_model(mdl, cp)
api = bindings.load()
vocab = llama_cpp.llama_model_get_vocab(mdl)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
toks = (llama_cpp.llama_token * 64)()
n = llama_cpp.llama_tokenize(vocab, prompt.encode(), len(prompt.encode()), toks, 64, True, False)
batch = list(toks[:n])
if warm == "1":
    for part in (batch, batch[:1]):
        arr = (llama_cpp.llama_token * len(part))(*part)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr))) == 0
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
if level != "off":
    api.session_begin(ctx, log, level, {})
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


def _run(model: Path, out: Path, level: str, peer: bool, ncmoe: int = 0, prompt: str = PROMPT,
         n_gen: int = 3, warm: bool = False, **env: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(out) + ".log", level, "1" if peer else "0",
         str(ncmoe), prompt, str(n_gen), str(out), "1" if warm else "0"],
        capture_output=True, text=True, env=vulkan_env() | env, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _child(model: Path, out: Path, level: str, peer: bool, ncmoe: int = 0, prompt: str = PROMPT,
           n_gen: int = 3, **env: str) -> tuple[np.ndarray, list[dict[str, int]]]:  # fmt: skip
    _run(model, out, level, peer, ncmoe, prompt, n_gen, **env)
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


def test_routing_is_read_with_the_devices_ops_untimed(moe_small: Path, tmp_path: Path) -> None:
    """LLAMA_INSTR_DEVICE_TIMING=0 leaves the device's ops untimed, not its routing: the experts
    records are the eval callback's, and no op, layer span or busy row comes from the device.
    Before the fix the Vulkan timer was not armed at all and the routing was dropped silently."""
    vulkan_device()
    _, peer = _child(moe_small, tmp_path / "untimed", "detailed", True,
                     LLAMA_INSTR_DEVICE_TIMING="0")  # fmt: skip
    logged = _logged(tmp_path / "untimed.log")
    assert len(logged) == len(peer) == 4
    for mine, theirs in zip(logged, peer, strict=True):
        assert mine == Counter({tuple(map(int, k.split(","))): v for k, v in theirs.items()})
    recs = read_log(tmp_path / "untimed.log")
    start = by_type(recs, "session_start")[0]
    (vk,) = [d["index"] for d in start["machine"]["devices"] if d["backend"] == "Vulkan"]
    for c in by_type(recs, "compute"):
        assert not c.get("busy") and not c.get("clocks")
        on_vk = [d == vk and a <= o[0] < b for o in c["ops"] for d, a, b, *_ in c["splits"]]
        assert not any(on_vk) and not [la for la in c["layers"] if la[4:] == [vk]]


def _against_the_perf_logger(
    moe_small: Path, out: Path, warm: bool
) -> list[tuple[int, int, int, int, int, float]]:
    """One process with ggml-vulkan's own per-op logger (GGML_VK_PERF_LOGGER: a timestamp and a
    barrier after every op) and a DETAILED session on the small MoE: per compute, (step, the ops'
    ns on the device, the routing reads' `read_dur`, the waits between its command buffers, the
    `busy` rows' sum, the logger's total)."""
    r = _run(moe_small, out, "detailed", False, n_gen=4, warm=warm, GGML_VK_PERF_LOGGER="1")
    totals = [float(t) * 1000 for t in re.findall(r"Total time: ([0-9.e+]+) us", r.stderr)]
    recs = read_log(Path(str(out) + ".log"))
    start = by_type(recs, "session_start")[0]
    (vk,) = [d["index"] for d in start["machine"]["devices"] if d["backend"] == "Vulkan"]
    computes = by_type(recs, "compute")
    reads = {(e["step"], e["ubatch"]): e.get("read_dur") for e in by_type(recs, "experts")}
    # the warm-up's computes come first in the logger's output, with no session
    assert len(computes) == 5 and len(totals) == 5 + (2 if warm else 0), (len(computes), totals)
    rows = []
    for c, logger in zip(computes, totals[len(totals) - 5 :], strict=True):
        busy = [b for b in c["busy"] if b[0] == vk]
        on_vk = [
            o for o in c["ops"] if any(d == vk and a <= o[0] < b for d, a, b, *_ in c["splits"])
        ]
        read = reads[(c["step"], c["ubatch"])]
        assert read is not None and read > 0, c["step"]
        waits = busy[-1][1] + busy[-1][2] - busy[0][1] - sum(b[2] for b in busy)
        rows.append(
            (c["step"], sum(o[2] for o in on_vk), read, waits, sum(b[2] for b in busy), logger)
        )
    return rows


def test_every_compute_within_5_percent_of_the_vulkan_perf_logger(
    moe_small: Path, tmp_path: Path
) -> None:
    """The logger's total per graph compute runs from its first timestamp to its last, so it also
    counts the time the device waited for the host between two command buffers: on the first
    compute that uses a pipeline (the prompt's here), lavapipe creating it on the host, which the
    log leaves in no op (the gaps between `busy` rows). Every compute's ops, routing reads (`read_dur`, timed by their own marks, in no
    op) and waits between its command buffers sum to the logger's total within 5 %, the ops and
    reads never to more than the device's busy time; the generation computes' ops and reads alone
    are within 5 %. Before the fix the routing read had no time of its own (it was inside the
    next op)."""
    vulkan_device()
    for step, ops, read, waits, busy, logger in _against_the_perf_logger(
        moe_small, tmp_path / "logged", warm=False
    ):
        assert ops + read <= busy
        assert abs(ops + read + waits - logger) <= 0.05 * logger, (step, ops, read, waits, logger)
        if step > 0:
            assert abs(ops + read - logger) <= 0.05 * logger, (step, ops, read, waits, logger)


def test_with_its_pipelines_made_the_prompts_ops_are_the_perf_loggers_total(
    moe_small: Path, tmp_path: Path
) -> None:
    """What the first compute's marks miss is the device's wait for the host creating the
    pipelines it uses for the first time, and nothing else: with the same prompt and a token
    decoded before the session (every pipeline made), every compute's ops and routing reads
    alone, the prompt's included, are within 5 % of the logger's total."""
    vulkan_device()
    for step, ops, read, waits, busy, logger in _against_the_perf_logger(
        moe_small, tmp_path / "warm", warm=True
    ):
        assert ops + read <= busy
        assert abs(ops + read - logger) <= 0.05 * logger, (step, ops, read, waits, logger)


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


def test_a_read_past_a_full_mark_buffer_is_never_taken_for_another_ops(
    vendor: Path, tmp_path: Path
) -> None:
    """Patch 0006's reads with room for 8 marks (tests/native/vk_read_marks.cpp): a chain of six
    argsorts on lavapipe, each read back. Every read recorded names a mark written for it, and
    the ones that ran hold their tensor's bytes; those past the room are dropped. Before the fix a
    read made with the buffer full named the last mark written (another op's) and counted as
    run."""
    import shutil

    from helpers.vulkan_backend import vulkan_lib

    vulkan_device()
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = vulkan_lib()
    exe = tmp_path / "vk_read_marks"
    native = Path(__file__).resolve().parent / "native"
    cmd = [cxx, "-std=c++17", "-O1", "-g", f"-I{vendor / 'ggml/include'}", f"-I{native}",
           str(native / "vk_read_marks.cpp"),
           *[str(lib / f"{n}.so") for n in ("libggml", "libggml-base", "libggml-vulkan")],
           f"-Wl,-rpath,{lib}", "-o", str(exe)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=vulkan_env(), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "reads checked" in r.stdout, r.stdout
