"""Memory (issue 34): every backend buffer by device and purpose, held to llama.cpp's own
breakdown; each step's memory figures; the memory budget; an out-of-memory that says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers.support import (
    PROMPT,
    assert_buffers_sum_to_breakdown,
    by_type,
    gguf_kv_bytes,
    gguf_kv_shape,
    instr,
    live_buffers,
    read_log,
)


@contextmanager
def cpu_budget(budget: int) -> Iterator[None]:
    """A memory budget of ``budget`` bytes on the CPU for the block, lifted after it."""
    from llamacpp_instr.running import api

    api.set_memory_budget(f"CPU={budget}")
    try:
        yield
    finally:
        api.set_memory_budget(None)


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

    from llamacpp_instr.running import api

    budget = 64 << 20
    with cpu_budget(budget):
        llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
        log = tmp_path / "budget.log"
        with api.session(llm, log, "minimal"):
            llm.eval(llm.tokenize(PROMPT.encode()))
            # a second context far too large for what is left: its KV cache fails to allocate
            with pytest.raises((ValueError, RuntimeError)):
                llama_cpp.Llama(str(tiny_llama_f32), n_ctx=1 << 20, n_threads=2, verbose=False)
            line = api.memory_failure()
        llm.close()
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


# A program that closes a descriptor it did not open and opens a file of its own at that number:
# the session's /proc/self/statm descriptor (kept open, read at every step) is then someone else's.
_STATM_TAKEN = """
import os, sys
import llama_cpp, llamacpp_instr
model, log, fake = sys.argv[1:4]
llm = llama_cpp.Llama(model, n_ctx=128, n_threads=1, verbose=False)
with llamacpp_instr.session(llm, log, level="minimal"):
    llm.eval([1, 40, 41, 42])
    mine = []
    for n in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{n}").endswith("/statm"):
                mine.append(int(n))
        except FileNotFoundError:
            pass  # listdir's own descriptor, closed since
    print("statm descriptors", len(mine), flush=True)
    for n in mine:
        os.close(n)
        other = os.open(fake, os.O_RDONLY)
        if other != n:
            os.dup2(other, n)
            os.close(other)
    llm.eval([43])
    with open("/proc/self/statm") as f:
        print("rss", int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE"), flush=True)
"""


def test_step_rss_survives_the_program_taking_its_descriptor(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Each step's RSS is read from a /proc/self/statm kept open. A program may close it and
    reuse the number for a file of its own (this one reads "1 2 3", which a parser of statm's
    first three numbers would take): the step after still says the process's own RSS."""
    fake = tmp_path / "fake"
    fake.write_text("1 2 3\n")
    log = tmp_path / "taken.log"
    r = subprocess.run(
        [sys.executable, "-c", _STATM_TAKEN, str(tiny_llama_f32), str(log), str(fake)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert lines["statm descriptors"] == "1"
    rss_after = int(lines["rss"])
    ends = by_type(read_log(log), "step_end")
    assert len(ends) == 2
    last = ends[-1]["memory"]["rss"]
    assert rss_after > 20 * 2**20  # a Python process with llama.cpp loaded
    assert abs(last - rss_after) < 0.2 * rss_after, (last, rss_after)


def test_free_memory_is_read_again_after_a_buffer_is_made(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A device's free memory is not read every step (a GPU's query costs tens of us): a step
    repeats the last read unless a backend buffer was made or freed since, or 100 ms passed.
    Under a budget the CPU's free memory is the budget less its live buffers: a second context's
    buffers, made between two steps, show at the very next one."""
    import llama_cpp

    from llamacpp_instr.running import api

    budget = 256 << 20
    with cpu_budget(budget):
        llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
        log = tmp_path / "free.log"
        with api.session(llm, log, "minimal"):
            llm.eval(llm.tokenize(PROMPT.encode()))
            other = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
            llm.eval([llm.token_eos()])
            other.close()
        llm.close()
    records = read_log(log)
    cpu = next(d["index"] for d in records[0]["machine"]["devices"] if d["name"] == "CPU")
    allocs = {r["id"]: r for r in by_type(records, "memory_alloc") if r["device"] == cpu}
    freed = {r["id"]: r["ts"] for r in by_type(records, "memory_free")}

    def free_at(t: int) -> int:
        live = [b["bytes"] for i, b in allocs.items() if b["ts"] <= t and freed.get(i, t + 1) > t]
        return budget - sum(live)

    ends = by_type(records, "step_end")
    got = [e["memory"]["free"][cpu] for e in ends]
    assert got == [free_at(e["t_start"] + e["dur"]) for e in ends]
    assert got[-1] < got[0]  # the second context's buffers, at the next step


def test_step_memory_can_be_left_out_to_measure_it(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """LLAMA_INSTR_STEP_MEMORY=0 leaves step_end's memory figures out (what bench/overhead.py
    measures their cost against); by default every step has them."""
    for value, has in (("0", False), ("1", True)):
        log = tmp_path / f"m{value}.log"
        r = subprocess.run(
            [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tiny_llama_f32), "-p", PROMPT,
             "-n", "3", "--ignore-eos", "--level", "minimal", "-o", str(log)],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "LLAMA_INSTR_STEP_MEMORY": value},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        ends = by_type(read_log(log), "step_end")
        assert len(ends) >= 3
        assert all(("memory" in e) == has for e in ends)


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
    from helpers.support import free_port

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
    from helpers.tiny_gguf import write_tiny_iswa_model

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


CONTEXT_SHIFT = r"""
import sys
import llama_cpp
from llamacpp_instr.running import api

model, log, after = sys.argv[1:4]
llm = llama_cpp.Llama(model, n_ctx=4096, n_batch=8, n_ubatch=8, n_threads=2,
                      type_k=llama_cpp.GGML_TYPE_Q8_0, verbose=False)
tokens = llm.tokenize(sys.argv[4].encode())[:20]
assert len(tokens) == 20
with api.session(llm, log, "minimal"):
    llm.eval(tokens)  # 3 steps: 8, 8 and 4 tokens
    # a context shift, as llama-cli and llama-server make one when the context is full: positions
    # 1-10 dropped, 11-19 moved back by 10; the next decode first rotates the cached K (a graph
    # of its own, which dequantizes each layer's q8_0 K to f32 for all 4096 cells)
    mem = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_seq_rm(mem, 0, 1, 11)
    llama_cpp.llama_memory_seq_add(mem, 0, 11, -1, -10)
    llm.n_tokens = 10
    llm.eval(tokens[10:11])
with api.session(llm, after, "minimal"):
    pass  # its session_start holds llama.cpp's breakdown after the shift, then every live buffer
"""


@pytest.fixture(scope="module")
def context_shift(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A run whose compute buffer the scheduler grows mid-run: the K-shift graph of a context
    shift needs more than the 8-token ubatch the context reserved for (in a process of its own,
    so that the log's buffers are this run's alone)."""
    d = tmp_path_factory.mktemp("shift")
    log, after = d / "shift.log", d / "after.log"
    r = subprocess.run(
        [sys.executable, "-c", CONTEXT_SHIFT, str(smollm2_path), str(log), str(after), PROMPT * 4],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    records, after_records = read_log(log), read_log(after)
    shift = by_type(records, "step_begin")[-1]
    return {
        "records": records,
        "after": after_records,
        "shift": shift,
        "made": [r for r in by_type(records, "memory_alloc") if r["ts"] > shift["ts"]],
        "freed": [r for r in by_type(records, "memory_free") if r["ts"] > shift["ts"]],
    }


def test_a_context_shift_grows_the_compute_buffer_in_its_step(
    context_shift: dict[str, Any], smollm2_path: Path
) -> None:
    records, shift = context_shift["records"], context_shift["shift"]
    assert len(by_type(records, "step_begin")) == 4 and shift["n_tokens"] == 1
    reserved = [b for b in live_buffers(records).values() if b["purpose"] == "compute"]
    assert len(reserved) == 1
    # in the shift's step, the reserved compute buffer is freed and a larger one made
    assert [f["id"] for f in context_shift["freed"]] == [reserved[0]["id"]]
    assert len(context_shift["made"]) == 1
    grown = context_shift["made"][0]
    end = next(e for e in by_type(records, "step_end") if e["step"] == shift["step"])
    assert shift["ts"] < grown["ts"] < end["ts"]
    # an independent bound: the shift holds one layer's K, 4096 cells, as f32
    _, n_embd_kv = gguf_kv_shape(smollm2_path)
    assert grown["bytes"] >= 4096 * n_embd_kv * 4 > reserved[0]["bytes"]
    # it is the compute buffer llama.cpp counts afterwards, and still live
    after = context_shift["after"]
    cpu = next(row for row in by_type(after, "session_start")[0]["memory"]["buffers"]
               if row["buffer"] == grown["buffer_type"])  # fmt: skip
    assert cpu["compute"] == grown["bytes"]
    assert grown["id"] in live_buffers(after)


def test_the_grown_compute_buffer_names_its_step_and_graph(
    context_shift: dict[str, Any],
) -> None:
    """The K-shift allocates its graph (the pin's llama_kv_cache::update) inside the compute
    purpose scope patch 0009 sets there, its graph indexed first: the grown buffer names its
    context, step and graph."""
    records, shift = context_shift["records"], context_shift["shift"]
    grown = context_shift["made"][0]
    # the graph that caused it: the first computed in the step, the K-shift's (no ubatch's tokens)
    cause = next(c for c in by_type(records, "compute") if c["step"] == shift["step"])
    assert cause["n_tokens"] == 0
    assert (grown["purpose"], grown.get("ctx"), grown.get("step"), grown.get("graph")) == (
        "compute",
        shift["ctx"],
        shift["step"],
        cause["graph"],
    )
    # and the live buffers, the grown one included, sum to llama.cpp's breakdown after it
    after = context_shift["after"]
    assert_buffers_sum_to_breakdown(after, live_buffers(after))


@pytest.mark.fast
def test_a_programs_setting_is_its_own_flags_else_its_sessions_context(tmp_path: Path) -> None:
    """What `instr exec` weighs in its out-of-memory line: llama.cpp's flags as the program got
    them (both spellings), what its session said of the context for the rest; llama-bench's
    lists (one value per test) and its context (-p + -n, no -c) are not taken for the failed
    test's."""
    from llamacpp_instr.running.memory_budget import program_setting

    context = {"n_ctx": 8192, "n_ubatch": 512, "type_k": "f16", "type_v": "q8_0"}
    cli = program_setting(
        "llama-cli", ["-m", str(tmp_path / "none.gguf"), "-c", "4096", "--ubatch-size=256",
                      "-ctk", "q8_0", "-ngl", "12"], context)  # fmt: skip
    assert (cli.n_ctx, cli.n_ubatch, cli.type_k, cli.type_v, cli.gpu_layers) == (
        4096, 256, "q8_0", "q8_0", 12
    )  # fmt: skip
    assert cli.n_layer is None and cli.q4k_saving == 0.0  # a model it cannot read
    server = program_setting("llama-server", ["-ngl", "all"], context)
    assert (server.n_ctx, server.n_ubatch, server.gpu_layers) == (8192, 512, None)
    bench = program_setting("llama-bench", ["-ub", "256,512", "-ctk", "q4_0"], context)
    assert (bench.n_ctx, bench.n_ubatch, bench.type_k, bench.type_v) == (0, 512, "q4_0", "f16")


@pytest.mark.fast
def test_the_failure_read_back_is_the_programs_own(tmp_path: Path) -> None:
    """Only what the program wrote after it started counts (an earlier run's failure in the same
    log does not), in the file at the path or one rotated from it since."""
    import json
    import time

    from llamacpp_instr.running.memory_budget import failure_in_log, mark_log

    def rec(type_: str, **fields: Any) -> str:
        return json.dumps({"type": type_, "ts": 1, "sid": "s", **fields}) + "\n"

    def failed(n: int) -> str:
        return rec("memory_alloc_failed", device=0, device_name="CPU", buffer_type="CPU",
                   purpose="kv_cache", bytes=n, free=1, total=2, by_budget=True, budget=2,
                   held={"weights": 1})  # fmt: skip

    log = tmp_path / "p.log"
    log.write_text(rec("session_start", schema_version=1) + failed(111))
    since = mark_log(log)
    assert failure_in_log(log, since) is None  # the earlier run's
    with log.open("a") as f:
        f.write(rec("session_start", schema_version=1, context={"n_ctx": 512}) + failed(222))
    found = failure_in_log(log, since)
    assert found is not None and found[0]["bytes"] == 222 and found[1] == {"n_ctx": 512}
    assert found[0]["held"] == {"weights": 1}
    # rotated since: the failure went to p.log.1 (the file it was written to), a new p.log began
    time.sleep(0.01)
    log.rename(tmp_path / "p.log.1")
    log.write_text(rec("session_start", schema_version=1, file={"index": 1}))
    found = failure_in_log(log, since)
    assert found is not None and found[0]["bytes"] == 222


# --- the observer's edges (issue 55 §1) --------------------------------------------------------


def _ggml() -> Any:
    """libggml-base and libggml as libllama loaded them, with the calls the tests below make."""
    import ctypes

    from helpers.rpc_backend import _lib

    from llamacpp_instr.native import bindings

    bindings.load()
    base = ctypes.CDLL(str(_lib("libggml-base")), mode=ctypes.RTLD_GLOBAL)
    ggml = ctypes.CDLL(str(_lib("libggml")), mode=ctypes.RTLD_GLOBAL)
    p, n = ctypes.c_void_p, ctypes.c_size_t
    for lib, name, res, args in [
        (ggml, "ggml_backend_dev_by_type", p, [ctypes.c_int]),
        (base, "ggml_backend_dev_buffer_type", p, [p]),
        (base, "ggml_backend_dev_backend_reg", p, [p]),
        (base, "ggml_backend_reg_get_proc_address", p, [p, ctypes.c_char_p]),
        (base, "ggml_backend_buft_name", ctypes.c_char_p, [p]),
        (base, "ggml_backend_buft_alloc_buffer", p, [p, n]),
        (base, "ggml_backend_buffer_free", None, [p]),
        (base, "ggml_backend_dev_buffer_from_host_ptr", p, [p, p, n, n]),
    ]:
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return base, ggml


def _cpu_repack(base: Any, cpu: int) -> int | None:
    """The CPU's repacked-weights buffer type (made through the CPU's own), if this CPU has one."""
    import ctypes

    get = base.ggml_backend_reg_get_proc_address(
        base.ggml_backend_dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts"
    )
    if not get:
        return None
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(cpu)
    i = 0
    while bufts and bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            return int(bufts[i])
        i += 1
    return None


def test_a_nested_allocation_that_fails_is_one_failure(instr_api: Any, tmp_path: Path) -> None:
    """A buffer type that makes its buffers through another one (CPU_REPACK through CPU) failing
    at the device: one memory_alloc_failed record, of the buffer type asked for. Before the fix
    the inner allocation and the outer one each wrote one."""
    from llamacpp_instr.running import api

    base, ggml = _ggml()
    cpu = ggml.ggml_backend_dev_by_type(0)
    repack = _cpu_repack(base, cpu)
    if repack is None:
        pytest.skip("this CPU has no repacked buffer type")
    log = tmp_path / "nested.log"
    with api.session(None, log, "minimal"):
        # more than any machine can give: the CPU buffer type's malloc fails
        assert not base.ggml_backend_buft_alloc_buffer(repack, 1 << 46)
    failed = by_type(read_log(log), "memory_alloc_failed")
    assert [(f["buffer_type"], f["by_budget"]) for f in failed] == [("CPU_REPACK", False)]


def test_the_budget_holds_buffers_made_from_host_memory(instr_api: Any, tmp_path: Path) -> None:
    """Host memory a device takes as a buffer (mmapped weights) is held to the budget as any
    allocation: past it, it fails and says so. Before the fix it was never checked."""
    import ctypes

    from llamacpp_instr.running import api

    base, ggml = _ggml()
    cpu = ggml.ggml_backend_dev_by_type(0)
    mem = ctypes.create_string_buffer((1 << 20) + 64)
    aligned = (ctypes.addressof(mem) + 63) & ~63  # (the CPU's buffers are aligned)
    log = tmp_path / "host.log"
    api.set_memory_budget("CPU=64K")
    try:
        with api.session(None, log, "minimal"):
            buf = base.ggml_backend_dev_buffer_from_host_ptr(cpu, aligned, 1 << 20, 1 << 20)
            if buf:
                base.ggml_backend_buffer_free(buf)
    finally:
        api.set_memory_budget(None)
    assert not buf, "a host buffer past the budget was made"
    failed = by_type(read_log(log), "memory_alloc_failed")
    assert len(failed) == 1 and failed[0]["by_budget"] and failed[0]["bytes"] == 1 << 20


def test_two_threads_never_both_pass_a_budget_with_room_for_one(instr_api: Any) -> None:
    """Two threads each allocate 40 MiB at once under a 64 MiB budget, 40 times over: never both
    buffers exist. Before the fix the budget was checked (may_alloc) and the buffer counted
    (on_alloc) under two separate locks, so both could pass, the device's malloc between."""
    import threading

    from llamacpp_instr.running import api

    base, ggml = _ggml()
    buft = base.ggml_backend_dev_buffer_type(ggml.ggml_backend_dev_by_type(0))
    size = 40 << 20
    both = 0
    api.set_memory_budget("CPU=64M")
    try:
        for _ in range(40):
            start = threading.Barrier(2)
            got: list[int] = []

            def alloc(start: threading.Barrier, got: list[int]) -> None:
                start.wait()
                got.append(base.ggml_backend_buft_alloc_buffer(buft, size) or 0)

            threads = [threading.Thread(target=alloc, args=(start, got)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            both += all(got)
            for b in got:
                if b:
                    base.ggml_backend_buffer_free(b)
    finally:
        api.set_memory_budget(None)
    assert both == 0, f"both threads passed the budget {both} times of 40"


_CACHES_KNOWN = r"""
import json, sys
import llama_cpp  # loads the libraries of LLAMA_CPP_LIB_PATH
from llamacpp_instr.native import bindings

api = bindings.load()
rows = []
for session in (True, False):
    if session:
        api.session_begin(None, sys.argv[2], "minimal", {})
    for _ in range(3):
        llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
        during = api.test_memory_caches()
        llm.eval([1, 2, 3])
        llm.close()
        rows.append([session, during, api.test_memory_caches()])
    if session:
        api.lib.llama_instr_session_end(None)
print(json.dumps(rows))
"""


def test_a_freed_cache_leaves_the_memory_table(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """The memory table knows a context's KV cache while it lives, and forgets it when the cache's
    last buffer is freed (issue 55 §1): a server making and freeing contexts for hours keeps a
    table of its live caches, not one entry per context it ever made, with a session open or
    not. Before the fix nothing left the table (each context freed here left one entry behind).
    In the testing build, which reads the table's size (llama_instr_test_memory_caches)."""
    r = subprocess.run(
        [sys.executable, "-c", _CACHES_KNOWN, str(tiny_llama_f32), str(tmp_path / "s.log")],
        capture_output=True,
        text=True,
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib)),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.splitlines()[-1])
    assert len(rows) == 6
    assert [(during, after) for _, during, after in rows] == [(1, 0)] * 6, rows
