"""The forked log reader (``converters/reading/prefetch.py``) gives exactly what ``iter_records`` gives:
the same records (ops columns and layer rows back to the same lists), the same report with skipped
lines in their place, the same strict error, and so the same trace."""

from __future__ import annotations

import gzip
import multiprocessing
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from helpers.support import (
    FIXTURES,
    ODD_OPS,
    REAL_FIXTURES,
    assert_same_trace,
    edit_ops,
    plain_copy,
    read_log,
    rewrite_log,
    write_log,
)

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.reading import prefetch
from llamacpp_instr.converters.reading.decode import columns
from llamacpp_instr.converters.reading.decode.fields import DECODED
from llamacpp_instr.converters.reading.decode.placement import Placement, placement
from llamacpp_instr.converters.reading.decode.transfers import Transfers, transfers
from llamacpp_instr.converters.reading.reader import ReadReport, iter_records

pytestmark = pytest.mark.fast


@pytest.fixture
def forked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)  # every log is big enough to fork for
    monkeypatch.setattr(prefetch, "cores", lambda: 2)  # (a one-core runner's tests fork too)
    monkeypatch.delenv("LLAMACPP_INSTR_NO_PREFETCH", raising=False)


def _norm(rec: dict[str, Any]) -> dict[str, Any]:
    """A compute record's ops as the per-op reader reads them: int() of each entry's first three
    values."""
    if rec["type"] != "compute":
        return rec
    return dict(rec, ops=[[int(x) for x in e[:3]] + e[3:] for e in rec["ops"]])


def both(path: Path, strict: bool = False) -> tuple[Any, ReadReport, Any, ReadReport]:
    want_rep, got_rep = ReadReport(), ReadReport()
    want = list(iter_records(path, strict=strict, report=want_rep))
    got = []
    decoded = []
    # the reading process may well have ended before the first record is looked at (a small log
    # fits in the pipe): count it when it starts
    records: list[Any] = []
    n_forks = _forks(lambda: records.extend(prefetch.records(path, strict=strict, report=got_rep)))
    for n, rec in records:
        if DECODED in rec:  # the reading process's decoding: what decoding it here gives
            rec = dict(rec)
            pre = rec.pop(DECODED)
            decoded.append(pre)
            if rec["type"] == "transfers":
                assert type(pre) is Transfers and pre == transfers(rec)
            else:
                assert type(pre) is Placement
                assert repr(pre) == repr(placement(rec, rec["t_start"]))
        if isinstance(rec.get("ops"), columns.PackedOps):
            rec = dict(rec, ops=rec["ops"].to_list())
        if isinstance(rec.get("layers"), np.ndarray):  # columns.layer_rows: starts made absolute
            layers = rec["layers"].copy()
            layers[:, 1] -= rec["t_start"]
            # rows naming a device have a fifth element; the others were given -1 there
            rows = [r[:4] if len(r) == 5 and r[4] == -1 else r for r in layers.tolist()]
            rec = dict(rec, layers=rows)
        got.append((n, rec))
    assert n_forks == 1, "not read in a forked process"
    devices = any(r["type"] == "transfers" or "splits" in r for _, r in want)
    assert bool(decoded) == devices  # (a device log's rows do come decoded)
    return want, want_rep, got, got_rep


def damaged(tmp_path: Path) -> Path:
    lines = gzip.open(FIXTURES / "tiny-llama-detailed.log.gz").read().splitlines(keepends=True)
    lines.insert(3, b"{not json\n")
    lines.insert(6, b'{"type": "from_the_future"}\n')
    lines[8] = lines[8].replace(b'"type"', b'"\xff\xfe":1,"type"', 1)  # invalid UTF-8, kept
    lines.append(lines[-1][:40])  # a truncated last line
    p = tmp_path / "damaged.log"
    p.write_bytes(b"".join(lines))
    return p


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("name", [p.name for p in REAL_FIXTURES] + ["damaged"])
def test_same_records_and_report(name: str, tmp_path: Path) -> None:
    path = damaged(tmp_path) if name == "damaged" else FIXTURES / name
    want, want_rep, got, got_rep = both(path)
    assert got == want
    assert got_rep == want_rep
    if name == "damaged":
        assert [n for n, _ in want_rep.skipped] == [4, 7, want_rep.lines]
        assert want_rep.replaced_utf8 == 1 and want_rep.unknown_types["from_the_future"] == 1


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("name", ["smollm2-moe4-verbose.log.gz", "damaged"])
def test_big_records_come_as_json_in_batches_of_bounded_bytes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record other than a compute or transfers one goes over the pipe as its JSON, and a
    message holds a few lines (``BIG_RECORD``, ``BATCH_BYTES`` made small): the same records and
    report (and for a damaged log, the same strict error) as ``iter_records`` gives."""
    monkeypatch.setattr(prefetch, "BIG_RECORD", 1)
    monkeypatch.setattr(prefetch, "BATCH_BYTES", 2048)
    path = damaged(tmp_path) if name == "damaged" else FIXTURES / name
    want, want_rep, got, got_rep = both(path)
    assert got == want
    assert got_rep == want_rep
    plain = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    assert want_rep.bytes == len(plain)
    if name == "damaged":
        with pytest.raises(UserError) as want_err:
            list(iter_records(path, strict=True))
        with pytest.raises(UserError) as got_err:
            list(prefetch.records(path, strict=True))
        assert str(got_err.value) == str(want_err.value)


@pytest.mark.usefixtures("forked")
def test_odd_values_read_as_the_per_op_reader_reads_them(tmp_path: Path) -> None:
    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c = [r for r in recs if r["type"] == "compute"]
        c[0]["ops"][0][1] = -5
        c[1]["ops"][0][0] = 10**6
        c[2]["ops"][2][2] = 7.5
        c[2]["ops"][3][1] = " 12 "
        c[3]["ops"][3] = c[3]["ops"][3][:3] + [[0, 10**6]]
        c[3]["ops"][5] = c[3]["ops"][5][:3] + [[1], 9]  # an entry too long: left as it is
        return recs

    log = rewrite_log(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path / "odd.log", edit)
    want, want_rep, got, got_rep = both(log)
    assert got_rep == want_rep
    assert [(n, _norm(r)) for n, r in got] == [(n, _norm(r)) for n, r in want]
    assert got != want  # (the odd values did come back as int() reads them)


@pytest.mark.usefixtures("forked")
def test_strict_error_comes_through(tmp_path: Path) -> None:
    path = damaged(tmp_path)
    with pytest.raises(UserError) as want:
        list(iter_records(path, strict=True))
    with pytest.raises(UserError) as got:
        list(prefetch.records(path, strict=True))
    assert str(got.value) == str(want.value) and "line 4" in str(got.value)


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("name", ["tiny-llama-detailed.log.gz", "tiny-llama-verbose.log.gz"])
def test_same_trace(name: str) -> None:
    assert_same_trace(FIXTURES / name)


def test_small_logs_read_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the log's size keeps it in this process: the same log forks once it counts as big."""
    monkeypatch.delenv("LLAMACPP_INSTR_NO_PREFETCH", raising=False)
    monkeypatch.setattr(prefetch, "cores", lambda: 2)
    assert prefetch.can_fork()  # (else this test could not fail)
    log = FIXTURES / "tiny-llama-detailed.log.gz"
    assert 0 < log.stat().st_size < prefetch.MIN_BYTES
    n = 0
    for _ in prefetch.records(log):
        assert not multiprocessing.active_children()
        n += 1
    assert n > 0
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    seen = [bool(multiprocessing.active_children()) for _ in prefetch.records(log)]
    assert any(seen)  # the control: big enough, it forks


@pytest.mark.usefixtures("forked")
def test_one_core_reads_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one core to run on, a big log is read in this process: the two processes would take
    turns, and only the fork's cost would be left."""
    log = FIXTURES / "tiny-llama-detailed.log.gz"
    seen = [bool(multiprocessing.active_children()) for _ in prefetch.records(log)]
    assert any(seen)  # the control: two cores, it forks
    monkeypatch.setattr(prefetch, "cores", lambda: 1)
    assert not prefetch.can_fork()
    seen = [bool(multiprocessing.active_children()) for _ in prefetch.records(log)]
    assert seen and not any(seen)


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("case", sorted(ODD_OPS))
def test_odd_compute_records_same_trace(case: str, tmp_path: Path) -> None:
    """Odd ops read by the forked reader: the trace the reference writer makes of them."""
    recs = read_log(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz")
    log = write_log(tmp_path / "odd.log", edit_ops(recs, 0, ODD_OPS[case]))
    try:
        list(iter_records(log, strict=True))
    except UserError:
        return
    assert_same_trace(log)  # the fast trace (forked) against the reference writer's


@pytest.mark.usefixtures("forked")
def test_reading_side_stops_early(capfd: pytest.CaptureFixture[str]) -> None:
    """A consumer that stops after the first record: the reader process ends, quietly."""
    for _ in prefetch.records(FIXTURES / "tiny-llama-verbose.log.gz"):
        break
    assert not multiprocessing.active_children()
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.usefixtures("forked")
def test_the_reader_leaves_an_interrupt_to_the_reading_side(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A SIGINT that reaches the reader process (a terminal's Ctrl-C reaches the whole group;
    the full suite once saw the reader print a KeyboardInterrupt's traceback) is the reading
    side's to act on: the reader reads on, quietly, and every record arrives."""
    import gzip
    import os
    import signal

    text = gzip.open(FIXTURES / "tiny-llama-verbose.log.gz", "rt").read()
    log = tmp_path / "long.log"
    log.write_text(text * 50)
    expected = sum(1 for _ in iter_records(log))
    n = 0
    for _ in prefetch.records(log):
        if n == 0:
            (child,) = multiprocessing.active_children()
            os.kill(child.pid, signal.SIGINT)
        n += 1
    assert n == expected > 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def _forks(fn: Any) -> int:
    """How many reader processes ``fn()`` started."""
    started: list[Any] = []
    real_start = multiprocessing.context.ForkProcess.start

    def start(proc: Any) -> None:
        real_start(proc)
        started.append(proc)

    with mock.patch.object(multiprocessing.context.ForkProcess, "start", start):
        fn()
    return len(started)


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("name", ["tiny-llama-detailed.log.gz", "tiny-llama-rpc2-detailed.log.gz"])
def test_tables_fork_from_their_own_size(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_session`` reads a log forked from ``TABLES_MIN_BYTES`` (not the trace writers'
    ``MIN_BYTES``), and its tables are the same either way (a device log's included)."""
    from llamacpp_instr.converters.analysis.frames import load_session

    log = FIXTURES / name
    monkeypatch.setattr(prefetch, "TABLES_MIN_BYTES", 1 << 40)  # MIN_BYTES is 0 (``forked``)
    here: list[Any] = []
    assert _forks(lambda: here.append(load_session(log))) == 0
    monkeypatch.setattr(prefetch, "TABLES_MIN_BYTES", 0)
    there: list[Any] = []
    assert _forks(lambda: there.append(load_session(log))) == 1
    a, b = here[0], there[0]
    tables = ["steps", "layers", "ops", "nodes", "splits", "copies", "remote", "transfers"]
    assert len(a.ops) > 0 and ("rpc" not in name or len(a.transfers) > 0)
    for t in tables:
        pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t))


@pytest.mark.usefixtures("forked")
def test_a_logs_own_decoded_key_is_only_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log is foreign bytes: a record that carries the key the reader's decoded forms travel
    under (``DECODED``) gets no say in what it means, read forked or here. The trace is the
    reference writer's, and the tables are those of the log without the key."""
    from llamacpp_instr.converters.analysis.frames import load_session

    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        n = 0
        for r in recs:
            if r["type"] in ("compute", "transfers"):
                r[DECODED] = {"splits": [[0, 0, 1, 0, 0, 0]], "rows": [], "t0": 7}
                n += 1
        assert n > 0  # (else this test could not fail)
        return recs

    src = FIXTURES / "tiny-llama-rpc2-detailed.log.gz"
    log = rewrite_log(src, tmp_path / "odd.log", edit)
    assert_same_trace(log)  # the fast trace (forked) against the reference writer's (here)
    want = load_session(plain_copy(src, tmp_path))
    for fork_from in (1 << 40, 0):  # read here, then forked
        monkeypatch.setattr(prefetch, "TABLES_MIN_BYTES", fork_from)
        got = load_session(log)
        for t in ("steps", "ops", "splits", "copies", "remote", "transfers"):
            pd.testing.assert_frame_equal(getattr(got, t), getattr(want, t))
