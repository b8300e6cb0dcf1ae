"""The Vulkan backend, timed by the device, on Mesa's lavapipe (see vulkan_backend.py).

A tiny gguf-py model fully offloaded (every layer on Vulkan0) and partially offloaded (the last
layers on Vulkan0, the rest on the CPU). Patch 0006 writes timestamp queries into the command
buffers ggml-vulkan records; llama-instr-ops-vulkan.cpp maps each interval to its node and puts it
on the host clock. The checks use facts measured independently: the scheduler's host-side split
and sync times bound the device's times, MINIMAL's per-layer op counts (counted by the backend)
equal DETAILED's timed ops, copies' bytes equal the tensors' sizes, and logits are compared with
the same build's uninstrumented run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import assert_buffers_sum_to_breakdown, by_type, live_buffers, read_log
from helpers.vulkan_backend import offload_run, vulkan_env

pytestmark = pytest.mark.vulkan

N_LAYER = 4
PARTIAL_NGL = 3  # layers 2 and 3 and the output on Vulkan0; layers 0 and 1 on the CPU
FIRST_VK = N_LAYER + 1 - PARTIAL_NGL  # llama.cpp offloads the last layers


@dataclass
class Offload:
    logits: dict[str, np.ndarray]
    logs: dict[str, list[dict[str, Any]]]

    def devices(self, level: str) -> list[dict[str, Any]]:
        start = by_type(self.logs[level], "session_start")[0]
        return list(start["machine"]["devices"])

    def vulkan(self, level: str) -> int:
        (vk,) = [d["index"] for d in self.devices(level) if d["backend"] == "Vulkan"]
        return int(vk)

    def cpu(self, level: str) -> int:
        (cpu,) = [d["index"] for d in self.devices(level) if d["backend"] == "CPU"]
        return int(cpu)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from helpers.tiny_gguf import write_tiny_model

    out = tmp_path_factory.mktemp("vk_model") / "tiny-llama4-f32.gguf"
    return write_tiny_model(out, arch="llama", dtype="f32", n_layer=N_LAYER, seed=4)


def _offload(model: Path, out: Path, ngl: int, levels: tuple[str, ...]) -> Offload:
    logits = offload_run(model, out, ngl, levels)
    logs = {lv: read_log(out / f"{lv}.log") for lv in levels if lv != "off"}
    return Offload(logits, logs)


@pytest.fixture(scope="module")
def full(tiny4: Path, tmp_path_factory: pytest.TempPathFactory) -> Offload:
    out = tmp_path_factory.mktemp("vk_full")
    return _offload(tiny4, out, 99, ("off", "minimal", "detailed", "verbose"))


@pytest.fixture(scope="module")
def partial(tiny4: Path, tmp_path_factory: pytest.TempPathFactory) -> Offload:
    out = tmp_path_factory.mktemp("vk_partial")
    return _offload(tiny4, out, PARTIAL_NGL, ("off", "detailed"))


def _graphs(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {g["graph"]: g for g in by_type(records, "graph")}


def _split_device(c: dict[str, Any], i: int) -> int:
    """The device of the split that holds node i."""
    for dev, i0, i1, *_ in c["splits"]:
        if i0 <= i < i1:
            return int(dev)
    raise AssertionError(f"node {i} is in no split of {c['splits']}")


def _device_ops(c: dict[str, Any], device: int) -> list[list[Any]]:
    return [op for op in c["ops"] if _split_device(c, op[0]) == device]


def _computes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cs = [c for c in by_type(records, "compute") if c["n_tokens"] > 0]
    assert len(cs) == 4  # the prompt and 3 generated tokens
    return cs


def test_every_record_validates(full: Offload, partial: Offload, schema_validator: Any) -> None:
    for run in (full, partial):
        for records in run.logs.values():
            for r in records:
                schema_validator.validate(r)


def test_logits_are_bit_identical_off_and_at_every_level(full: Offload, partial: Offload) -> None:
    # Vulkan against Vulkan: lavapipe's numerics differ from the CPU backend's
    for run, levels in ((full, ("minimal", "detailed", "verbose")), (partial, ("detailed",))):
        off = run.logits["off"]
        assert off.shape == (9, 512) and np.isfinite(off).all()
        for level in levels:
            assert run.logits[level].tobytes() == off.tobytes(), level


def test_a_full_offload_times_every_layer_and_op_on_the_device(full: Offload) -> None:
    records = full.logs["detailed"]
    vk = full.vulkan("detailed")
    graphs = _graphs(records)
    for c in _computes(records):
        nodes = graphs[c["graph"]]["nodes"]
        # every layer's nodes run on Vulkan0 (the token embedding's lookup stays on the CPU)
        assert {_split_device(c, i) for i, n in enumerate(nodes) if n["layer"] is not None} == {vk}
        ops = _device_ops(c, vk)
        timed = {op[0] for op in ops} | {j for op in ops if len(op) > 3 for j in op[3]}
        computed = {i for i, n in enumerate(nodes) if "noop" not in n["flags"]}
        on_vk = {i for i in computed if _split_device(c, i) == vk}
        # every node Vulkan0 computed is timed, once (a fused group may take views along)
        assert on_vk <= timed and all("noop" in nodes[i]["flags"] for i in timed - on_vk)
        assert len(timed) == sum(1 + len(op[3]) if len(op) > 3 else 1 for op in ops)
        for op in ops:
            # a fused group's members follow its first node in the table, which is in the
            # order the backend runs the nodes
            if len(op) > 3:
                assert op[3] == list(range(op[0] + 1, op[0] + 1 + len(op[3])))
        # in execution order, one after another: each starts where the previous one ended, or
        # later (a new command buffer)
        for a, b in zip(ops, ops[1:], strict=False):
            assert a[1] + a[2] <= b[1], (a, b)
        # every layer has a span on Vulkan0, made of its ops
        spans = {s[0]: s for s in c["layers"] if len(s) == 5 and s[4] == vk}
        assert sorted(spans) == list(range(N_LAYER))
        for layer, span in spans.items():
            mine = [op for op in ops if nodes[op[0]]["layer"] == layer]
            assert span[3] == len(mine) > 0
            assert span[1] == min(op[1] for op in mine)
            assert span[1] + span[2] == max(op[1] + op[2] for op in mine)
        # lavapipe calibrates (VK_EXT_calibrated_timestamps); a driver without it: the fenced pair
        ((dev, method, unc),) = c["clocks"]
        assert dev == vk and method in ("calibrated", "fence") and unc >= 0


def test_timed_ops_cover_the_device_busy_time(full: Offload) -> None:
    """Busy time is measured by the device itself: each command buffer from its first command to
    its last. The ops' intervals, between the marks after each op, must account for nearly all of
    it (what is left: copies and barriers outside any op, the buffer's own start and end; on
    lavapipe, whose "device" is CPU threads, also the moments the OS ran something else)."""
    records = full.logs["detailed"]
    vk = full.vulkan("detailed")
    busy_total = op_total = 0
    for c in _computes(records):
        busy = [b for b in c["busy"] if b[0] == vk]
        assert busy and all(b[2] > 0 for b in busy)
        busy_ns = sum(b[2] for b in busy)
        ops = _device_ops(c, vk)
        op_ns = sum(op[2] for op in ops)
        # each op lies within one command buffer
        for op in ops:
            assert any(b[1] <= op[1] and op[1] + op[2] <= b[1] + b[2] for b in busy), op
        assert 0 < op_ns <= busy_ns, (op_ns, busy_ns, c["step"])
        assert sum(b[4] for b in busy) == len(ops)
        busy_total += busy_ns
        op_total += op_ns
    assert op_total >= 0.90 * busy_total, op_total / busy_total


def _assert_on_the_host_clock(c: dict[str, Any], device: int) -> None:
    """Device intervals, put on the host clock, fall where the host saw the device work: no
    command buffer starts before its split was handed to the backend, and all of them end before
    the host saw the device done (the sync after the compute); give or take the clock's stated
    uncertainty."""
    ((dev, method, unc),) = c["clocks"]
    assert dev == device and unc >= 0
    synced = c["dur"] + c["wait"]
    for b in c["busy"]:
        # a buffer without ops (copies) is of no split
        assert (b[3] >= 0) == (b[4] > 0), b
        launch = 0
        if b[3] >= 0:
            assert c["splits"][b[3]][0] == device
            launch = c["splits"][b[3]][4]
        assert launch - unc <= b[1] and b[1] + b[2] <= synced + unc, (b, c["splits"], synced)


def test_device_times_are_on_the_host_clock(full: Offload, partial: Offload) -> None:
    for run in (full, partial):
        vk = run.vulkan("detailed")
        for c in _computes(run.logs["detailed"]):
            _assert_on_the_host_clock(c, vk)


def test_the_fenced_clock_pair_where_the_driver_has_no_calibration(
    tiny4: Path, tmp_path: Path
) -> None:
    env = dict(vulkan_env(), LLAMA_INSTR_DEVICE_CLOCK="fence")
    offload_run(tiny4, tmp_path, 99, ("minimal",), n_gen=1, env=env)
    records = read_log(tmp_path / "minimal.log")
    (vk,) = [
        d["index"]
        for d in by_type(records, "session_start")[0]["machine"]["devices"]
        if d["backend"] == "Vulkan"
    ]
    computes = by_type(records, "compute")
    assert computes
    for c in computes:
        assert c["clocks"][0][1] == "fence"
        # half a submit's round trip, plus drift since the pair: well under a millisecond on a
        # quiet machine, 3.7 ms on two cores at half speed (the round trip waits for the CPU);
        # a pair from another clock or another submit would be off by far more
        assert 0 < c["clocks"][0][2] < 100_000_000
        _assert_on_the_host_clock(c, vk)


def test_minimal_marks_only_layer_boundaries(full: Offload) -> None:
    """MINIMAL writes a timestamp after each layer's last op (and each command buffer's last), not
    after every op: its layer spans count the ops the backend recorded between marks, which must
    be the ops DETAILED timed one by one in each layer."""
    vk = full.vulkan("minimal")
    minimal, detailed = _computes(full.logs["minimal"]), _computes(full.logs["detailed"])
    for cm, cd in zip(minimal, detailed, strict=True):
        assert "ops" not in cm
        spans = {s[0]: s for s in cm["layers"] if len(s) == 5 and s[4] == vk}
        assert sorted(spans) == list(range(N_LAYER))
        counts = {s[0]: s[3] for s in cd["layers"] if len(s) == 5 and s[4] == vk}
        assert {layer: s[3] for layer, s in spans.items()} == counts
        first, last = min(b[1] for b in cm["busy"]), max(b[1] + b[2] for b in cm["busy"])
        for s in spans.values():
            assert s[2] > 0 and first <= s[1] and s[1] + s[2] <= last
        _assert_on_the_host_clock(cm, vk)


def test_a_partial_offload_splits_between_the_devices_and_copies_the_tensors(
    partial: Offload,
) -> None:
    records = partial.logs["detailed"]
    vk, cpu = partial.vulkan("detailed"), partial.cpu("detailed")
    graphs = _graphs(records)
    weights = {w["name"]: w for w in by_type(records, "session_start")[0]["weights"]}
    on_vk = {f"blk.{i}." for i in range(FIRST_VK, N_LAYER)}
    for name, w in weights.items():
        if name.startswith("blk."):
            assert w["buffer"].startswith("Vulkan") == any(name.startswith(p) for p in on_vk)
    for c in _computes(records):
        nodes = graphs[c["graph"]]["nodes"]
        assert {s[0] for s in c["splits"]} == {vk, cpu}
        # the first layers run on the CPU, the last ones on Vulkan0; the scheduler may run the
        # last CPU layer's residual add on Vulkan0, where its result goes
        main = {layer: vk if layer >= FIRST_VK else cpu for layer in range(N_LAYER)}
        for layer in range(N_LAYER):
            devs = [_split_device(c, i) for i, n in enumerate(nodes) if n["layer"] == layer]
            other = [d for d in devs if d != main[layer]]
            assert len(other) <= (1 if layer == FIRST_VK - 1 else 0), (layer, devs)
        spans = {(s[0], s[4] if len(s) == 5 else cpu) for s in c["layers"]}
        assert set(main.items()) <= spans <= set(main.items()) | {(FIRST_VK - 1, vk)}
        # the CPU's ops and Vulkan0's: each timed by its own backend
        assert _device_ops(c, cpu) and _device_ops(c, vk)
        # what crossed over, each copy the copied tensor's size
        assert c["copies"], "nothing crossed between the devices"
        leaf_bytes = {s["name"]: s["bytes"] for n in nodes for s in n["src"] if "name" in s}
        for split, node, name, nbytes, src, dst, _t0, _dur in c["copies"]:
            assert c["splits"][split][0] == dst and {src, dst} == {vk, cpu}
            expected = nodes[node]["bytes"] if node >= 0 else leaf_bytes.get(name)
            assert nbytes == expected, (name, nbytes, expected)


# one session at DETAILED whose environment changes after the prompt, then a second session
SWITCH_CHILD = r"""
import os, sys
import llama_cpp, llamacpp_instr
model, out = sys.argv[1:3]
llm = llama_cpp.Llama(model, n_ctx=128, n_threads=2, n_threads_batch=2, verbose=False,
                      n_gpu_layers=99)
with llamacpp_instr.session(llm, f"{out}/a.log", level="detailed"):
    llm.eval([1, 40, 41, 42])
    os.environ["LLAMA_INSTR_DEVICE_TIMING"] = "0"  # too late for this session
    llm.eval([43])
    llm.eval([44])
with llamacpp_instr.session(llm, f"{out}/b.log", level="detailed"):
    llm.eval([45])
llm.close()
"""


def test_the_device_switches_are_read_once_per_session(tiny4: Path, tmp_path: Path) -> None:
    """LLAMA_INSTR_DEVICE_TIMING is read at a session's first compute, not at every compute
    (getenv per compute scanned the environment and raced a setenv): a change in the middle of
    a session takes effect at the next one."""
    import subprocess
    import sys

    from helpers.vulkan_backend import vulkan_device

    vulkan_device()
    r = subprocess.run(
        [sys.executable, "-c", SWITCH_CHILD, str(tiny4), str(tmp_path)],
        capture_output=True,
        text=True,
        env=vulkan_env(),
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_log(tmp_path / "a.log"), read_log(tmp_path / "b.log")
    (vk,) = [
        d["index"]
        for d in by_type(a, "session_start")[0]["machine"]["devices"]
        if d["backend"] == "Vulkan"
    ]
    timed = [
        any(row[0] == vk for row in c.get("busy", []))
        for c in by_type(a, "compute")
        if c["n_tokens"] > 0
    ]
    assert timed == [True, True, True]  # the prompt and both tokens after the change
    later = [c for c in by_type(b, "compute") if c["n_tokens"] > 0]
    assert later
    for c in later:
        assert "busy" not in c and "clocks" not in c
        assert not [op for op in c.get("ops", []) if _split_device(c, op[0]) == vk]


def test_partial_offload_buffers_sum_to_llamas_breakdown_per_device(partial: Offload) -> None:
    """Issue 34: every buffer of a partial offload, by buffer type and purpose, against llama.cpp's
    own llama_get_memory_breakdown (session_start.memory); the device holds part of the weights
    and the KV cache of its layers, the CPU the rest."""
    records = partial.logs["detailed"]
    live = live_buffers(records)
    breakdown = by_type(records, "session_start")[0]["memory"]["buffers"]
    assert any(row["buffer"].startswith("Vulkan") for row in breakdown)
    assert_buffers_sum_to_breakdown(records, live)
    vk, cpu = partial.vulkan("detailed"), partial.cpu("detailed")
    on = {(b["device"], b["purpose"]) for b in live.values() if b["bytes"] > 0}
    assert {(vk, "weights"), (vk, "kv_cache"), (cpu, "weights"), (cpu, "kv_cache")} <= on
    # every step says the device's free memory as ggml reports it
    for end in by_type(records, "step_end"):
        assert end["memory"]["free"][vk] is not None
