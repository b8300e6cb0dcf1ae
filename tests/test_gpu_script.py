"""bench/gpu_check.sh run --dry-run: the GPU script's plumbing on the CPU (the build the tests run
on standing in for the CUDA one, a tiny model for the 1B), with a segmentation fault injected
into one step: every step runs in its order and is recorded, the faulting step with its signal
and the frames the crash tracer prints, the steps after it still run, the GPU-only parts (the
build, CUPTI) are marked dry, and OUT holds what the device tool returns (at most eight files):
the summary, the console, the fixture logs and the rest packed."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parent.parent
STEPS = [
    "tracer",
    "build",
    "quantize",
    "smoke",
    "cost",
    "cupti",
    "graph-opt",
    "headline",
    "fixtures",
    "sampling",
    "moe",
    "faults",
]
FIXTURES = [
    "l1b-cuda-full-detailed",
    "l1b-cuda-full-minimal",
    "l1b-cuda-half-detailed",
    "moe-cuda-ncmoe4-detailed",
]


def test_the_dry_run_records_a_fault_and_goes_on(instr_api: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, GPU_CHECK_FAULT="headline")
    env.pop("LLAMA_BENCH", None)
    r = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "run", "--dry-run", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # the fault, and only it
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["dry_run"] is True
    status = {s["step"]: s["status"] for s in doc["steps"]}
    assert list(status) == STEPS
    assert status["headline"] == "FAILED: signal 11"
    dry = {"build", "cupti", "graph-opt", "moe"}  # no nvcc and no CUPTI here
    assert {k for k, v in status.items() if v == "dry"} == dry
    assert all(status[k] == "ok" for k in STEPS if k not in dry | {"headline"}), status
    console = (out / "console.txt").read_text()
    # the injected fault's frames: Python's, then the native ones, in the step's output
    assert "in cmd_crash" in console and "### native crash: signal 11" in console
    assert "### FAILED: headline (FAILED: signal 11)" in console
    # the figures the CPU can give are read; no target is judged
    checks = {c["check"]: c for c in doc["checks"]}
    assert all(c["met"] is None for c in checks.values())
    assert checks["summary against llama-bench (defaults)"]["measured"] == "not measured"
    assert "MINIMAL" in checks["cost, C API loop, graphs on"]["measured"]
    assert checks["greedy text and logits with a session"]["measured"] == "text True, logits True"
    assert "64 sampled of 64" in checks["sampling against llama_perf_sampler"]["measured"]
    assert "regions in" in checks["GRAPH_OPT: ops spanning a concurrent region"]["measured"]
    assert "runs per setting" in checks["no fault, 10 runs of each setting"]["measured"]
    # what comes back: a few files, the fixture logs session logs under their fixture names
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size < 16 << 20 for p in out.iterdir())
    assert files == sorted(
        ["console.txt", "gpu_check.json", "results.tgz", *(f"{n}.log.gz" for n in FIXTURES)]
    )
    for name in FIXTURES:
        with gzip.open(out / f"{name}.log.gz", "rt") as f:
            first, last = json.loads(f.readline()), json.loads(f.readlines()[-1])
        assert first["type"] == "session_start" and last["type"] == "session_end"
    with tarfile.open(out / "results.tgz") as tf:
        names = tf.getnames()
    assert "./steps.tsv" in names and "./crash.txt" in names
    assert any(n.startswith("./faults/") and n.endswith(".err") for n in names)


def test_a_second_command_goes_on_from_the_first(instr_api: Any, tmp_path: Path) -> None:
    """GPU_CHECK_ONLY on the machine of an earlier command (its work folder): only the steps named
    run (and the model's, reused), the fault rounds go on after the last one run, and the summary
    counts both commands' runs."""
    work = tmp_path / "work"

    def run(only: str, out: Path) -> dict[str, Any]:
        env = dict(os.environ, GPU_CHECK_WORK=str(work), GPU_CHECK_ONLY=only, GPU_CHECK_ROUNDS="2")
        r = subprocess.run(
            ["bash", str(ROOT / "bench" / "gpu_check.sh"), "run", "--dry-run", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return dict(json.loads((out / "gpu_check.json").read_text()))

    first = run("smoke", tmp_path / "first")
    assert [s["step"] for s in first["steps"]] == ["tracer", "build", "quantize", "smoke"]
    second = run("faults", tmp_path / "second")
    assert [s["step"] for s in second["steps"]] == ["tracer", "build", "quantize", "faults"]
    assert (
        "the model of an earlier command here" in (tmp_path / "second" / "console.txt").read_text()
    )
    runs = second["figures"]["faults"]
    assert len(runs) == 6 and all(v == {"runs": 2, "failed": 0} for v in runs.values()), runs
