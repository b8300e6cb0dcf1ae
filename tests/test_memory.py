"""Memory (issue 34): every backend buffer by device and purpose, held to llama.cpp's own
breakdown; each step's memory figures; the memory budget; an out-of-memory that says why."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support import (
    PROMPT,
    assert_buffers_sum_to_breakdown,
    by_type,
    live_buffers,
    read_log,
)


def gguf_kv_bytes(model: Path, n_ctx: int) -> int:
    """An f16 KV cache's bytes from the model's own hyperparameters (no llama.cpp involved)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)

    def value(key: str) -> int:
        f = reader.fields[key]
        return int(f.parts[f.data[0]][0])

    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    n_layer = value(f"{arch}.block_count")
    n_embd = value(f"{arch}.embedding_length")
    n_head = value(f"{arch}.attention.head_count")
    n_head_kv = value(f"{arch}.attention.head_count_kv")
    n_embd_kv = n_embd // n_head * n_head_kv
    return n_layer * n_ctx * 2 * n_embd_kv * 2


class Run:
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path


def run_alone(model: Path, out: Path, level: str, n_predict: int, n_ctx: int) -> Run:
    """``instr run`` in a process of its own: the process's buffers are then this run's alone
    (a log lists every buffer of its process, and pytest's holds other tests' models)."""
    r = instr(
        "run", str(model), "-p", PROMPT, "-n", str(n_predict), "--ctx", str(n_ctx), "-t", "2",
        "--ignore-eos", "--level", level, "-o", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return Run(out)


@pytest.fixture(scope="module")
def smollm2_run(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    out = tmp_path_factory.mktemp("memory") / "smollm2.log"
    return run_alone(smollm2_path, out, "minimal", n_predict=6, n_ctx=1024)


def test_purpose_sums_equal_llamas_own_breakdown(smollm2_run: Any, smollm2_path: Path) -> None:
    records = read_log(smollm2_run.log_path)
    start = records[0]
    live = live_buffers(records)
    assert live, "no memory_alloc record before the first step"
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for b in live.values():
        sums[(b["buffer_type"], b["purpose"])] += b["bytes"]
    # llama_get_memory_breakdown, as session_start writes it: per buffer type
    assert_buffers_sum_to_breakdown(records, live)
    breakdown = start["memory"]["buffers"]
    # and every buffer llama.cpp counts is one of ours (no type missing from its breakdown)
    counted = {
        row["buffer"] for row in breakdown if row["weights"] + row["kv_cache"] + row["compute"]
    }
    ours_types = {
        bt for (bt, p) in sums if p in ("weights", "kv_cache", "compute") and sums[(bt, p)]
    }
    assert ours_types == counted
    # an independent fact: the KV cache's size from the model's hyperparameters
    kv = sum(b["bytes"] for b in live.values() if b["purpose"] == "kv_cache")
    assert kv == gguf_kv_bytes(smollm2_path, 1024)


def test_every_step_says_kv_cells_rss_and_free_memory(smollm2_run: Any) -> None:
    records = read_log(smollm2_run.log_path)
    n_devices = len(records[0]["machine"]["devices"])
    ends = by_type(records, "step_end")
    assert len(ends) >= 2
    decoded = 0
    for end in ends:
        decoded += end["n_tokens"]
        mem = end["memory"]
        assert len(mem["kv"]) == 1  # one cache for a plain llama
        cache, used, size = mem["kv"][0]
        assert cache >= 0
        assert used == decoded  # one sequence: every token decoded holds one cell
        assert size == 1024
        assert 0 < mem["rss_file"] < mem["rss"]
        assert mem["rss_anon"] == mem["rss"] - mem["rss_file"]
        assert len(mem["free"]) == n_devices


def test_a_budget_is_what_ggml_reports_and_what_fails(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Under a budget, session_start's device total is the budget and each step's free memory is
    the budget less the live buffers; an allocation past it is recorded and says what it needed."""
    import llama_cpp

    from llamacpp_instr import api

    budget = 64 << 20
    api.set_memory_budget(f"CPU={budget}")
    try:
        llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
        log = tmp_path / "budget.log"
        with api.session(llm, log, "minimal"):
            llm.eval(llm.tokenize(PROMPT.encode()))
            # a second context far too large for what is left: its KV cache fails to allocate
            with pytest.raises((ValueError, RuntimeError)):
                llama_cpp.Llama(str(tiny_llama_f32), n_ctx=1 << 20, n_threads=2, verbose=False)
            line = api.memory_failure()
        llm.close()
    finally:
        api.set_memory_budget(None)
    assert log.read_bytes().endswith(b"\n")
    records = read_log(log)
    cpu = next(d for d in records[0]["machine"]["devices"] if d["name"] == "CPU")
    assert cpu["memory_total"] == budget
    live = live_buffers(records)
    used = sum(b["bytes"] for b in live.values() if b["device"] == cpu["index"])
    end = by_type(records, "step_end")[0]
    assert end["memory"]["free"][cpu["index"]] == budget - used
    failed = by_type(records, "memory_alloc_failed")
    assert failed, "the failed allocation was not recorded"
    f = failed[0]
    assert (f["device_name"], f["purpose"], f["by_budget"], f["budget"]) == (
        "CPU",
        "kv_cache",
        True,
        budget,
    )
    # what was free when it failed: the budget less every buffer live at that moment
    assert f["free"] == budget - sum(f["held"].values())
    assert f["bytes"] > f["free"]
    # what each purpose held then: the buffers the log says were live (the second model's
    # weights, loaded in the session, included)
    held: dict[str, int] = defaultdict(int)
    for b in live_buffers(records, until_type="memory_alloc_failed").values():
        held[b["purpose"]] += b["bytes"]
    assert {k: v for k, v in f["held"].items() if v} == dict(held)
    # the second model's weights were loaded in the session: recorded as it happened
    start_ts = records[0]["ts"]
    assert any(
        r["purpose"] == "weights" and r["ts"] > start_ts for r in by_type(records, "memory_alloc")
    )
    assert line is not None and line.startswith("out of memory on CPU")
    assert "kv_cache needed" in line


def instr(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_run_that_does_not_fit_says_why_and_what_would(
    smollm2_run: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    records = read_log(smollm2_run.log_path)
    live = live_buffers(records)
    by_purpose: dict[str, int] = defaultdict(int)
    for b in live.values():
        by_purpose[b["purpose"]] += b["bytes"]
    # room for everything but half the compute buffers
    budget = sum(by_purpose.values()) - by_purpose["compute"] // 2
    log = tmp_path / "oom.log"
    r = instr(
        "run", str(smollm2_path), "-p", PROMPT, "-n", "4", "--ctx", "1024", "-o", str(log),
        "--memory-budget", f"CPU={budget}",
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    msg = lines[0]
    assert msg.startswith("error: out of memory on CPU"), msg
    assert "compute needed" in msg and "short by" in msg
    assert "--ubatch 256" in msg and "-ctk q8_0 -ctv q8_0" in msg
    assert not log.exists()  # the model never ran: no session, no log
    # the same setting with the whole footprint allowed runs
    r = instr(
        "run", str(smollm2_path), "-p", PROMPT, "-n", "4", "--ctx", "1024", "-o", str(log),
        "--memory-budget", f"CPU={sum(by_purpose.values())}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "spec, says",
    [
        ("CPU=12X", "not a size"),
        ("CPU", "DEVICE=SIZE"),
        ("=5M", "DEVICE=SIZE"),
        ("NoSuchDevice=1G", "no device 'NoSuchDevice'"),
    ],
)
def test_a_malformed_budget_is_one_line_and_no_log(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path, spec: str, says: str
) -> None:
    log = tmp_path / "bad.log"
    for args, env in (
        (["--memory-budget", spec], None),
        ([], {"LLAMA_INSTR_MEMORY_BUDGET": spec}),
    ):
        r = instr("run", str(tiny_llama_f32), "-p", "x", "-n", "1", "-o", str(log), *args, env=env)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr
        assert not log.exists()


def test_serve_that_does_not_fit_says_why(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    from support import free_port

    log = tmp_path / "serve.log"
    r = instr(
        "serve", str(tiny_llama_f32), "--port", str(free_port()), "-o", str(log), "--ctx", "512",
        "--memory-budget", "CPU=1M",
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory on CPU (budget 1.0 MiB)")
    assert not log.exists()


def test_an_iswa_model_has_two_caches_summed_as_llama_does(instr_api: Any, tmp_path: Path) -> None:
    from tiny_gguf import write_tiny_iswa_model

    model = write_tiny_iswa_model(tmp_path / "tiny-gemma2.gguf")
    records = read_log(run_alone(model, tmp_path / "iswa.log", "minimal", 4, 512).log_path)
    live = live_buffers(records)
    kv = [b for b in live.values() if b["purpose"] == "kv_cache"]
    assert sorted(b["cache_kind"] for b in kv) == ["full", "swa"]
    assert len({b["cache"] for b in kv}) == 2
    assert_buffers_sum_to_breakdown(records, live)
    # every step reports both caches
    for end in by_type(records, "step_end"):
        assert sorted(c for c, _, _ in end["memory"]["kv"]) == sorted(b["cache"] for b in kv)


def test_repacked_weights_are_counted_once(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Q4_0 weights on x86 are repacked into CPU_REPACK buffers, which ggml makes as CPU buffers
    and retypes: each is one buffer, of its final type, summed as llama.cpp sums it."""
    import llama_cpp

    model = tmp_path / "tiny-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    rc = llama_cpp.llama_model_quantize(
        str(tiny_llama_f32).encode(), str(model).encode(), llama_cpp.byref(params)
    )
    assert rc == 0
    records = read_log(run_alone(model, tmp_path / "q4.log", "minimal", 3, 256).log_path)
    live = live_buffers(records)
    assert_buffers_sum_to_breakdown(records, live)
