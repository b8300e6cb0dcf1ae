"""The native core under stress and failure: concurrent sessions, full disks, removed logs,
arbitrary token bytes, and the C API's return codes."""

from __future__ import annotations

import itertools
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.support import PROMPT, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamacpp_instr.native import bindings

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parent.parent


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a log, strictly: whole, newline-terminated, valid UTF-8 JSON objects."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path}: last line is not whole"
    return [json.loads(line.decode("utf-8")) for line in data.split(b"\n")[:-1]]


def load_llama(model: Path, **kw: Any) -> Any:
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(model), n_ctx=256, n_batch=64, n_threads=1, verbose=False, **kw
    )


# --- concurrency ---------------------------------------------------------------------------------


def hold_for_a_whole_decode(decodes: list[int], limit_s: float = 60) -> None:
    """Keep the session open until some worker has finished two decodes since now: the second
    began and ended inside it, so a whole step lands in the session whatever a decode takes
    (a sanitizer slows them down many times, and the machine's load changes their pace)."""
    start = list(decodes)
    t_end = time.monotonic() + limit_s
    while all(d < s + 2 for d, s in zip(decodes, start, strict=True)) and time.monotonic() < t_end:
        time.sleep(0.005)


def test_sessions_begin_and_end_while_contexts_decode(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Three threads decode on their own contexts while the main thread opens and closes sessions
    at every level: no crash, every session's file whole and well-formed, and no context ever
    writes into a session it did not join."""
    llms = [load_llama(tiny_llama_f32) for _ in range(3)]
    stop = threading.Event()
    errors: list[BaseException] = []
    decodes = [0] * len(llms)

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            while not stop.is_set():
                llms[i].reset()
                llms[i].eval([1] + [rng.randrange(3, 300) for _ in range(rng.randrange(1, 12))])
                decodes[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(llms))]
    for t in threads:
        t.start()
    paths = []
    try:
        rng = random.Random(0)
        # at least 24 sessions, and on until every worker decoded a few times while they came and
        # went (a sanitizer slows everything down); bounded in count and time
        t_end = time.monotonic() + 120
        k = 0
        while k < 24 or (min(decodes) < 3 and k < 2000 and time.monotonic() < t_end):
            path = tmp_path / f"s{k}.log"
            paths.append(path)
            instr_api.session_begin(None, str(path), ("minimal", "detailed", "verbose")[k % 3], {})
            # every fourth session holds a whole decode, so that whole steps land inside sessions
            if k % 4 == 3:
                hold_for_a_whole_decode(decodes)
            else:
                time.sleep(rng.uniform(0.0, 0.05))
            instr_api.session_end("ok")
            k += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        for llm in llms:
            llm.close()
    assert not errors, errors
    assert min(decodes) >= 3
    steps = 0
    for path in paths:
        recs = whole_lines(path)
        assert recs[0]["type"] == "session_start" and recs[-1]["type"] == "session_end"
        sid = recs[0]["sid"]
        assert all(r["sid"] == sid for r in recs)
        assert recs[-1]["totals"]["lost"] == 0
        assert recs[-1]["totals"]["records"] == len(recs)
        # a step that was recorded was recorded whole: its step_end follows its step_begin
        begun = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_begin"}
        ended = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_end"}
        assert ended <= begun
        steps += len(ended)
    assert steps > 0


def test_a_session_begun_on_a_decoding_context(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """session_begin(ctx) while ctx decodes on another thread (issue 21, bug 3): ctx joins on its
    own thread at its next step, as ctx 1, so no session gets a step_end without its step_begin
    (and the thread sanitizer sees no race on the context's session fields)."""
    llm = load_llama(tiny_llama_f32)
    stop = threading.Event()
    errors: list[BaseException] = []
    decodes = [0]

    def worker() -> None:
        rng = random.Random(1)
        try:
            while not stop.is_set():
                llm.reset()
                llm.eval([1] + [rng.randrange(3, 300) for _ in range(rng.randrange(1, 12))])
                decodes[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    paths = []
    try:
        rng = random.Random(0)
        t_end = time.monotonic() + 120
        k = 0
        while k < 60 or (decodes[0] < 10 and time.monotonic() < t_end):
            path = tmp_path / f"c{k}.log"
            paths.append(path)
            instr_api.session_begin(
                llm.ctx, str(path), ("minimal", "detailed", "verbose")[k % 3], {}
            )
            # every fourth session holds a whole decode, so that whole steps land inside sessions
            if k % 4 == 3:
                hold_for_a_whole_decode(decodes)
            else:
                time.sleep(rng.uniform(0.0, 0.02))
            instr_api.session_end("ok")
            k += 1
    finally:
        stop.set()
        t.join()
        llm.close()
    assert not errors, errors
    steps = 0
    for path in paths:
        recs = whole_lines(path)
        assert recs[0]["type"] == "session_start" and "model" in recs[0]
        begun = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_begin"}
        ended = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_end"}
        assert ended <= begun, f"{path.name}: step_end without its step_begin"
        assert {c for c, _ in begun} <= {1}  # the context named in session_start is ctx 1
        steps += len(ended)
    assert steps > 0


def test_a_second_session_is_refused(instr_api: Any, tmp_path: Path) -> None:
    instr_api.session_begin(None, str(tmp_path / "a.log"), "minimal", {})
    try:
        with pytest.raises(bindings.SessionError, match="already open") as exc:
            instr_api.session_begin(None, str(tmp_path / "b.log"), "minimal", {})
        assert exc.value.code == bindings.ERR_BUSY
    finally:
        instr_api.session_end("ok")
    assert not (tmp_path / "b.log").exists()
    with pytest.raises(bindings.SessionError) as exc:
        instr_api.session_end("ok")
    assert exc.value.code == bindings.ERR_NO_SESSION


def test_bad_arguments_get_their_codes(instr_api: Any, tmp_path: Path) -> None:
    lib = instr_api.lib
    assert lib.llama_instr_session_begin(None, str(tmp_path / "x.log").encode(), 4, None) == (
        bindings.ERR_INVALID_ARG
    )
    assert lib.llama_instr_session_begin(None, str(tmp_path / "x.log").encode(), 2, b"[1]") == (
        bindings.ERR_INVALID_ARG
    )
    assert b"JSON object" in lib.llama_instr_last_error()
    # a newline in the metadata would split the NDJSON record
    assert lib.llama_instr_session_begin(
        None, str(tmp_path / "x.log").encode(), 2, b'{"a":\n1}'
    ) == (bindings.ERR_INVALID_ARG)
    assert not (tmp_path / "x.log").exists()
    assert lib.llama_instr_set_topk(0) == bindings.ERR_INVALID_ARG
    assert lib.llama_instr_set_level(2) == bindings.ERR_NO_SESSION
    assert lib.llama_instr_get_level() == 0


# --- write failures ------------------------------------------------------------------------------


def test_full_device_fails_the_session_begin(instr_api: Any) -> None:
    with pytest.raises(bindings.SessionError, match="No space left on device") as exc:
        instr_api.session_begin(None, "/dev/full", "detailed", {})
    assert exc.value.code == bindings.ERR_IO
    assert instr_api.get_level() == 0


def test_instr_run_on_a_full_device_is_one_line_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llamacpp_instr.cli",
            "run",
            "-p",
            "Hi",
            "-n",
            "2",
            "-o",
            "/dev/full",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "No space left on device" in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def _limit_file_size(limit: int) -> None:
    # writes past `limit` fail with EFBIG instead of killing the process (SIGXFSZ ignored): a disk
    # that fills up while the run is going
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_disk_filling_up_mid_run_fails_the_run(tiny_llama_f32: Path, tmp_path: Path) -> None:
    log = tmp_path / "filled.log"
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tiny_llama_f32), "-p", PROMPT]
        + ["-n", "150", "--ignore-eos", "-t", "1", "--level", "detailed", "-o", str(log)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: _limit_file_size(48 * 1024),
    )
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: writing the log {log} failed: File too large"), r.stderr
    assert "Traceback" not in r.stderr
    # what reached the disk before it filled is intact, and the session never claimed success
    size = log.stat().st_size
    assert 0 < size <= 48 * 1024
    data = log.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    recs = [json.loads(line) for line in complete.splitlines()]
    assert recs[0]["type"] == "session_start"
    assert all(r["type"] != "session_end" for r in recs)


def test_removed_log_is_reported_at_session_end(instr_api: Any, tmp_path: Path) -> None:
    path = tmp_path / "gone.log"
    instr_api.session_begin(None, str(path), "minimal", {})
    path.unlink()
    with pytest.raises(bindings.SessionError, match="was removed while the session was open") as e:
        instr_api.session_end("ok")
    assert e.value.code == bindings.ERR_IO


# --- graphs kept across a new scheduler ----------------------------------------------------------


def _tables_after_a_control_vector(model: Path, log: Path, with_cvec: bool) -> list[Any]:
    """With the vector: the generation graph built before the session, reused in it at minimal
    (indexed as split and kept without its table), a control vector applied (llama.cpp reserves
    its graphs again under a new scheduler) and cleared (again), then the generation graph built
    again at detailed. Without: the same steps, all in a session at detailed. The node table of
    the last step's graph, as written."""
    import ctypes

    import llama_cpp
    from helpers.support import read_log
    from llama_cpp import llama_cpp as L

    api = bindings.load()
    llm = llama_cpp.Llama(
        model_path=str(model), n_ctx=128, n_batch=16, n_ubatch=16, n_threads=1, verbose=False
    )
    try:
        n_embd, n_layer = L.llama_model_n_embd(llm.model), L.llama_model_n_layer(llm.model)
        if with_cvec:
            llm.eval([1, 2, 3, 4])
            llm.eval([5])
        api.session_begin(llm.ctx, str(log), "minimal" if with_cvec else "detailed", {})
        try:
            if not with_cvec:
                llm.eval([1, 2, 3, 4])
                llm.eval([5])
            llm.eval([6])
            if with_cvec:
                data = (ctypes.c_float * (n_embd * n_layer))(*([0.01] * (n_embd * n_layer)))
                assert (
                    L.llama_set_adapter_cvec(
                        llm.ctx, data, n_embd * n_layer, n_embd, 1, n_layer - 1
                    )
                    == 0
                )
            llm.eval([7])
            api.set_level("detailed")
            if with_cvec:
                assert L.llama_set_adapter_cvec(llm.ctx, None, 0, n_embd, -1, -1) == 0
            llm.eval([8])
            llm.eval([9])
        finally:
            api.session_end("ok")
    finally:
        llm.close()
    recs = read_log(log)
    graphs = {g["graph"]: g["nodes"] for g in recs if g["type"] == "graph"}
    last = [c for c in recs if c["type"] == "compute"][-1]
    return [
        (n["name"], n["op"], n["layer"], n["shape"], n["src"], n["flags"])
        for n in graphs[last["graph"]]
    ]


def test_a_kept_graph_reused_after_a_control_vector_came_and_went(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A control vector applied and cleared between a kept graph and its reuse (issue 55 §1):
    llama.cpp reserves its graphs again under a new scheduler each time, freeing the old one's
    copies and the graphs built with it. The graph built again at the kept one's addresses has the
    node table a session without the vector, at detailed throughout, writes for it. Run it under AddressSanitizer
    (docs/internals.md): before the fix a kept index could hold freed sources (the scheduler's
    copies, an adapter's tensors) and capture() followed them; the fingerprint now covers the
    sources, and kept graphs are dropped when the scheduler changes
    (test_native_units.test_a_kept_graph_is_not_a_graph_with_other_sources)."""
    got = _tables_after_a_control_vector(tiny_llama_f32, tmp_path / "cvec.log", True)
    want = _tables_after_a_control_vector(tiny_llama_f32, tmp_path / "plain.log", False)
    assert got == want


# --- UTF-8 ---------------------------------------------------------------------------------------

# pieces a byte-level vocabulary can hold: lone continuation bytes, truncated sequences, overlong
# forms, surrogates, code points above U+10FFFF, and valid characters next to them
NASTY_PIECES = [
    b"\x80",
    b"\xbf\xbf",
    b"ab\xe2\x82",
    b"\xe2\x82\xac",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"\xf0\x9f\x98",
    b"\xf0\x9f\x98\x80",
    b"\xff\xfe",
    b'"\\\n\x01',
]


@pytest.fixture(scope="module")
def raw_piece_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    from helpers.tiny_gguf import _vocab, write_tiny_model

    rng = random.Random(7)
    # no NUL: llama.cpp's vocabulary cuts a token's text there, before the writer sees it
    pieces = NASTY_PIECES + [
        bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 7))) for _ in range(40)
    ]
    # distinct pieces, none the text of a token the vocabulary has already (it maps text to ids)
    taken = {t.encode() if isinstance(t, str) else t for t in _vocab()[0]}
    pieces = [p for p in dict.fromkeys(pieces) if p not in taken]
    path = tmp_path_factory.mktemp("raw") / "tiny-raw-pieces.gguf"
    return write_tiny_model(path, seed=5, raw_pieces=pieces), pieces


_example = itertools.count()


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_writer_emits_only_valid_utf8_for_any_piece(
    instr_api: Any, raw_piece_model: tuple[Path, list[bytes]], tmp_path: Path, data: Any
) -> None:
    from helpers.tiny_gguf import FIRST_RAW_PIECE

    model, pieces = raw_piece_model
    ids = data.draw(
        st.lists(st.integers(0, len(pieces) - 1), min_size=1, max_size=12), label="pieces"
    )
    tokens = [FIRST_RAW_PIECE + i for i in ids]
    log = tmp_path / f"utf8-{next(_example)}.log"  # hypothesis reseeds `random`: count instead
    llm = load_llama(model)
    try:
        instr_api.session_begin(llm.ctx, str(log), "detailed", {"note": "caf\u00e9 \U0001f600"})
        llm.eval(tokens)
        instr_api.session_end("ok")
    finally:
        llm.close()
    recs = whole_lines(log)  # raises on any invalid UTF-8
    begin = next(r for r in recs if r["type"] == "step_begin")
    assert begin["tokens"] == tokens
    assert begin["pieces"] == [pieces[i].decode("utf-8", "replace") for i in ids]
    assert recs[0]["metadata"] == {"note": "caf\u00e9 \U0001f600"}


# --- the run command -----------------------------------------------------------------------------


def test_invalid_byte_in_generated_text_prints_once() -> None:
    from llamacpp_instr.running.runner import TextStream

    s = TextStream()
    out = s.feed(b"A\xff") + s.feed(b"B") + s.feed(b"C") + s.close()
    assert out == "A\ufffdBC"
    # a character split across tokens prints when it completes, once
    s = TextStream()
    parts = [s.feed(b"x\xe2"), s.feed(b"\x82"), s.feed(b"\xacy"), s.close()]
    assert parts == ["x", "", "\u20acy", ""]


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "-1"], "-1 is not in the range x>=0"),
        (["--ubatch", "0"], "0 is not in the range x>=1"),
        (["--batch", "64", "--ubatch", "128"], "--ubatch must be between 1 and --batch (64)"),
        (["--ctx", "0"], "0 is not in the range x>=1"),
        (["--top-k-logits", "0"], "0 is not in the range 1<=x<=1000"),
    ],
)
def test_bad_run_arguments_are_rejected_before_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    log = tmp_path / "never.log"
    missing_model = tmp_path / "nope.gguf"  # would fail later, at load time: must not get there
    r = CliRunner().invoke(main, ["run", str(missing_model), "-p", "x", "-o", str(log), *args])
    assert r.exit_code == 2
    assert message in r.output and "model file not found" not in r.output
    assert not log.exists()


def test_failed_run_leaves_no_log_behind(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    log = tmp_path / "run.log"
    r = CliRunner().invoke(main, ["run", str(bad), "-p", "x", "-o", str(log)])
    assert r.exit_code == 2 and r.output.startswith("error: ")
    assert not log.exists()


def test_run_succeeds_and_reports_no_loss(tiny_llama_f32: Path, tmp_path: Path) -> None:
    res = make_run(tiny_llama_f32, tmp_path / "ok.log", "minimal", n_predict=3)
    end = whole_lines(res.log_path)[-1]
    assert end["status"] == "ok" and end["totals"]["lost"] == 0


def test_verbose_topk_matches_the_logits(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every output row's top-k in the log is numpy's top-k of the logits llama.cpp returned
    (ties by lower token id), values to float32 precision."""
    import numpy as np

    monkeypatch.setenv("LLAMA_INSTR_VALUE_STATS", "1")  # and the statistics of the same logits

    log = tmp_path / "topk.log"
    llm = load_llama(tiny_llama_f32, logits_all=True)
    try:
        tokens = [1, 45, 80, 81, 90, 300, 301, 120]
        instr_api.set_topk(7)
        instr_api.session_begin(llm.ctx, str(log), "verbose", {})
        llm.eval(tokens)
        instr_api.session_end("ok")
        scores = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        instr_api.set_topk(10)
        llm.close()
    recs = whole_lines(log)
    # the value statistics of the output projection are numpy's over the same logits
    (graph,) = [r for r in recs if r["type"] == "graph"]
    (out_node,) = [n["i"] for n in graph["nodes"] if n["name"] == "result_output"]
    (stats,) = [r for r in recs if r["type"] == "tensor_stats"]
    (row,) = [x for x in stats["stats"] if x[0] == out_node]
    _, mn, mx, mean, std, n_nan, n_inf = row
    assert (np.float32(mn), np.float32(mx)) == (scores.min(), scores.max())
    assert mean == pytest.approx(float(scores.astype(np.float64).mean()), rel=1e-6, abs=1e-9)
    assert std == pytest.approx(float(scores.astype(np.float64).std()), rel=1e-6)
    assert (n_nan, n_inf) == (0, 0)
    (rec,) = [r for r in recs if r["type"] == "topk"]
    assert rec["k"] == 7 and len(rec["rows"]) == len(tokens)
    for row in rec["rows"]:
        logits = scores[row["row"]]
        ids = np.arange(len(logits))
        want = np.lexsort((ids, -logits))[:7]
        assert row["ids"] == want.tolist()
        assert [np.float32(v) for v in row["logits"]] == logits[want].tolist()
