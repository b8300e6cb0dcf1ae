"""The run just made is what the reading commands show: ``instr run -o LOG`` replaces an existing
log (kept beside it as LOG.old, as ``perf record`` keeps perf.data.old), ``--append`` adds a
session, and every reading command of a log of several sessions shows the latest, saying so on
stderr with how to pick another (``--session``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, instr, read_log


def _run(model: Path, log: Path, *more: str) -> str:
    r = instr(
        "run", str(model), "-p", "Hello", "-n", "2", "--ctx", "256", "-t", "2", "-o", str(log),
        *more,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stderr


def _sids(log: Path) -> list[str]:
    return [r["sid"] for r in by_type(read_log(log), "session_start")]


def test_o_replaces_the_log_and_keeps_the_old_one(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "fa.log"
    _run(tiny_llama_f32, log)
    (first,) = _sids(log)
    said = _run(tiny_llama_f32, log, "--no-flash-attn")
    (second,) = _sids(log)  # the log holds the rerun alone
    assert second != first
    old = tmp_path / "fa.log.old"
    assert _sids(old) == [first]
    assert f"the log that was there is {old}" in said
    r = instr("summary", str(log), "--format", "json")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["overview"]["session"] == second
    assert doc["overview"]["flash_attn"]["used"] is False  # the rerun's setting, not the first's
    _run(tiny_llama_f32, log)  # a third run: .old holds the second
    assert _sids(old) == [second]


def test_append_adds_a_session_and_readers_show_the_latest(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "two.log"
    _run(tiny_llama_f32, log)
    said = _run(tiny_llama_f32, log, "--append", "--no-flash-attn")
    assert "the log that was there" not in said and not (tmp_path / "two.log.old").exists()
    first, second = _sids(log)
    r = instr("summary", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["overview"]["session"] == second
    (note,) = [x for x in r.stderr.splitlines() if x.startswith("note:")]
    assert "holds 2 sessions; showing the latest, 2 of 2" in note and second in note
    assert "--session SID shows another" in note and first in note
    r = instr("summary", str(log), "--session", first, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["overview"]["session"] == first
    assert "showing session, 1 of 2" in r.stderr
    for args in (
        ["requests", str(log)],  # (exit 2: a run's log holds no requests)
        ["export", str(log), "--workloads"],
        ["compare", str(log), str(log)],
    ):
        r = instr(*args)
        assert r.returncode in (0, 2) and "Traceback" not in r.stderr, (args, r.stderr)
        assert "holds 2 sessions; showing the latest" in r.stderr, (args, r.stderr)
    r = instr("to-perfetto", str(log), "-o", str(tmp_path / "two.pftrace"))
    assert r.returncode == 0, r.stderr
    assert "holds 2 sessions: one process each" in r.stderr


@pytest.mark.fast
def test_the_note_names_a_bounded_number_of_sessions() -> None:
    from llamacpp_instr.converters.analysis.frames import NOTE_SESSIONS, sessions_note

    sids = [(f"s{i}", f"t{i}") for i in range(1000)]
    note = sessions_note("big.log", sids, "s999")
    assert note is not None and "holds 1000 sessions; showing the latest, 1000 of 1000" in note
    assert note.count("(t") == NOTE_SESSIONS and f"and {999 - NOTE_SESSIONS} earlier" in note
    assert sessions_note("one.log", sids[:1], "s0") is None
