"""The C API's contract (issue 21): the caller's JSON is validated for real, the log file starts on
a fresh line, reaches the disk while the process is idle, survives a chdir, is private, and a
session leaves nothing behind."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings

pytestmark = pytest.mark.native


def records(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the last line is not whole"
    return [json.loads(line) for line in data.decode().splitlines()]


# --- write_record and metadata -------------------------------------------------------------------

BAD_OBJECTS = [
    b'{"a":"}',  # an unterminated string that looks like an object
    b'{"a":1,}',
    b'{"a" 1}',
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":01}',
    b'{"a":[1,2}',
    b'{"a":1}{"b":2}',
    b'{"a":"\\x"}',
    b'{"a":"\\ud800"}',  # a lone surrogate
    b'{"a":tru}',
    b"{a:1}",
    b'{"a":1} x',
    b'{"a":"\xff"}',
    b"[1]",
    b"{",
    b"",
]


@pytest.mark.parametrize("body", BAD_OBJECTS)
def test_write_record_refuses_what_is_not_one_json_object(
    instr_api: Any, tmp_path: Path, body: bytes
) -> None:
    lib = instr_api.lib
    instr_api.session_begin(None, str(tmp_path / "r.log"), "minimal", {})
    try:
        assert lib.llama_instr_write_record(b"mine", body) == bindings.ERR_INVALID_ARG
        assert b"JSON object" in lib.llama_instr_last_error()
    finally:
        instr_api.session_end("ok")
    recs = records(tmp_path / "r.log")
    assert [r["type"] for r in recs] == ["session_start", "session_end"]
    # the record refused is counted lost (issue 55 §1: llama-server's request records, refused
    # for their text, vanished without a trace)
    assert recs[-1]["totals"]["lost"] == 1
    # the same text is refused as metadata, and no log is made
    meta = tmp_path / "m.log"
    assert lib.llama_instr_session_begin(None, str(meta).encode(), 1, body or b"x") == (
        bindings.ERR_INVALID_ARG
    )
    assert not meta.exists()


def test_reserved_keys_are_the_top_level_keys_decoded(instr_api: Any, tmp_path: Path) -> None:
    lib = instr_api.lib
    log = tmp_path / "r.log"
    instr_api.session_begin(None, str(log), "minimal", {})
    try:
        for body in [b'{"type":1}', b'{"\\u0074ype":1}', b'{"a":1, "s\\u0069d":"x"}', b'{"ts":1}']:
            assert lib.llama_instr_write_record(b"mine", body) == bindings.ERR_INVALID_ARG, body
            assert b"type, ts or sid" in lib.llama_instr_last_error()
        # the same words as values, or as keys of a nested object, are the caller's
        accepted = [
            {"cmd": "curl -X type", "note": '"type"', "k": '"ts":'},
            {"nested": {"type": 1, "sid": [{"ts": 2}]}},
            {"x": -1.5e-3, "y": [True, False, None, "\u00e9\U0001f600"]},
            {},
        ]
        for fields in accepted:
            instr_api.write_record("mine", fields)
        with pytest.raises(UserError, match="NaN"):
            instr_api.write_record("mine", {"x": float("nan")})
    finally:
        instr_api.session_end("ok")
    mine = [r for r in records(log) if r["type"] == "mine"]
    assert len(mine) == len(accepted)
    for got, want in zip(mine, accepted, strict=True):
        assert {k: v for k, v in got.items() if k not in ("type", "ts", "sid")} == want


# --- the log file ---------------------------------------------------------------------------------


def test_an_appended_session_starts_on_a_fresh_line(instr_api: Any, tmp_path: Path) -> None:
    """A log that ends mid-line (the disk filled up): the next session's records are whole lines."""
    log = tmp_path / "a.log"
    log.write_bytes(b'{"type":"session_start"}\n{"type":"step_be')
    instr_api.session_begin(None, str(log), "minimal", {})
    instr_api.session_end("ok")
    lines = log.read_bytes().split(b"\n")
    assert lines[1] == b'{"type":"step_be'
    assert json.loads(lines[2])["type"] == "session_start"
    assert json.loads(lines[3])["type"] == "session_end"
    assert lines[4:] == [b""]


def test_an_idle_process_buffered_records_reach_the_file(instr_api: Any, tmp_path: Path) -> None:
    log = tmp_path / "idle.log"
    instr_api.session_begin(None, str(log), "minimal", {})
    try:
        instr_api.write_record("mine", {"i": 1})  # buffered: nothing else happens after it
        t0 = time.monotonic()
        while b'"mine"' not in log.read_bytes() and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        waited = time.monotonic() - t0
        assert b'"mine"' in log.read_bytes(), "the record never reached the file"
        assert waited < 1.0  # 200 ms, with room for a loaded machine
    finally:
        instr_api.session_end("ok")


def test_a_chdir_gives_no_false_io_error(
    instr_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    instr_api.session_begin(None, "rel.log", "minimal", {})
    os.chdir(tmp_path / "b")
    instr_api.session_end("ok")  # raises SessionError on ERR_IO
    assert [r["type"] for r in records(tmp_path / "a" / "rel.log")] == [
        "session_start",
        "session_end",
    ]


def test_removing_the_log_after_a_chdir_is_still_reported(
    instr_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    instr_api.session_begin(None, "gone.log", "minimal", {})
    os.chdir("/")
    (tmp_path / "gone.log").unlink()
    with pytest.raises(bindings.SessionError, match="removed") as exc:
        instr_api.session_end("ok")
    assert exc.value.code == bindings.ERR_IO


def test_logs_are_private_and_never_written_through_a_symlink(
    instr_api: Any, tmp_path: Path
) -> None:
    old = os.umask(0o022)
    try:
        instr_api.session_begin(None, str(tmp_path / "p.log"), "minimal", {})
        instr_api.session_end("ok")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.log").stat().st_mode) == 0o600
    target = tmp_path / "target"
    target.write_text("keep\n")
    link = tmp_path / "link.log"
    link.symlink_to(target)
    lib = instr_api.lib
    assert lib.llama_instr_session_begin(None, str(link).encode(), 1, None) == bindings.ERR_IO
    assert target.read_text() == "keep\n"
    assert lib.llama_instr_session_end(None) == bindings.ERR_NO_SESSION


# --- leave nothing behind -------------------------------------------------------------------------


def test_session_end_leaves_the_level_off_under_concurrent_set_level(
    instr_api: Any, tmp_path: Path
) -> None:
    """set_level racing session_end must not leave recording on with no session."""
    lib = instr_api.lib
    stop = threading.Event()
    calls = [0]

    def spam() -> None:
        while not stop.is_set():
            lib.llama_instr_set_level(3)
            calls[0] += 1

    t = threading.Thread(target=spam)
    t.start()
    left_on = 0
    try:
        for _ in range(1500):
            instr_api.session_begin(None, str(tmp_path / "l.log"), "minimal", {})
            instr_api.session_end("ok")
            left_on += lib.llama_instr_get_level() != 0
    finally:
        stop.set()
        t.join()
    assert calls[0] > 0
    assert left_on == 0, f"the level was left on after {left_on} of 1500 session ends"
