"""The reader never drops a line for invalid UTF-8 alone: it reads it with U+FFFD in place of each
bad sequence, and counts it. Token pieces are where such bytes come from (a piece cut in the middle
of a multi-byte character), so that is where these tests put them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.reading.reader import ReadReport, iter_records
from llamacpp_instr.converters.session.fold import load

pytestmark = pytest.mark.fast

DETAILED = FIXTURES / "tiny-llama-detailed.log.gz"

with gzip.open(DETAILED, "rb") as _f:
    LINES: list[bytes] = _f.readlines()
RECORDS: list[dict[str, Any]] = [json.loads(line) for line in LINES]
# the step_begin lines that carry token pieces (DETAILED records them)
BEGINS = [i for i, r in enumerate(RECORDS) if r["type"] == "step_begin" and r.get("pieces")]

# ill-formed UTF-8: lone continuation bytes, overlong forms, UTF-16 surrogates, code points past
# U+10FFFF, bytes that never occur in UTF-8, and sequences cut short
BAD_UTF8 = [
    b"\x80",
    b"\xbf",
    b"\x80\x80",
    b"\xc0\xaf",
    b"\xc1\xbf",
    b"\xe0\x80\xaf",
    b"\xf0\x80\x80\xaf",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xed\xa0\x80\xed\xb0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf7\xbf\xbf\xbf",
    b"\xf8\x88\x80\x80\x80",
    b"\xfe",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xf0\x9f\x98",
]


def _char_json(c: str) -> bytes:
    """One character as it stands inside a JSON string (escaped if JSON needs it), UTF-8."""
    return json.dumps(c, ensure_ascii=False)[1:-1].encode("utf-8")


def step_begin_line(rec: dict[str, Any], pieces: list[list[tuple[bytes, bytes]]]) -> bytes:
    """``rec`` as one NDJSON line with ``pieces`` last, written from raw chunks: each piece is a
    list of (bytes inside the JSON string, the bytes they stand for)."""
    head = json.dumps({k: v for k, v in rec.items() if k != "pieces"}, separators=(",", ":"))
    body = b",".join(b'"' + b"".join(raw for raw, _ in p) + b'"' for p in pieces)
    return head[:-1].encode() + b',"pieces":[' + body + b"]}\n"


def chunks(piece: str) -> list[tuple[bytes, bytes]]:
    return [(_char_json(c), c.encode("utf-8")) for c in piece]


def expected_piece(piece: list[tuple[bytes, bytes]]) -> str:
    """What the piece's bytes say, each ill-formed sequence read as U+FFFD (Python's codec)."""
    return b"".join(value for _, value in piece).decode("utf-8", errors="replace")


def read_all(path: Path, strict: bool = False) -> tuple[list[tuple[int, Any]], ReadReport]:
    rep = ReadReport()
    return list(iter_records(path, strict=strict, report=rep)), rep


def write_log(tmp_path: Path, lines: list[bytes], name: str = "utf8.log") -> Path:
    log = tmp_path / name
    log.write_bytes(b"".join(lines))
    return log


def test_fixture_has_pieces() -> None:
    assert len(BEGINS) >= 3 and all(LINES[i].decode("utf-8") for i in BEGINS)


@pytest.mark.parametrize("junk", BAD_UTF8, ids=lambda b: b.hex())
def test_invalid_utf8_in_a_piece_keeps_the_line(junk: bytes, tmp_path: Path) -> None:
    i = BEGINS[0]
    rec = RECORDS[i]
    pieces = [chunks(p) for p in rec["pieces"]]
    pieces[1] = pieces[1] + [(junk, junk)]
    lines = list(LINES)
    lines[i] = step_begin_line(rec, pieces)
    with pytest.raises(UnicodeDecodeError):
        lines[i].decode("utf-8")
    log = write_log(tmp_path, lines)
    for strict in (False, True):
        got, rep = read_all(log, strict=strict)
        assert [n for n, _ in got] == list(range(1, len(LINES) + 1))
        assert rep.skipped == [] and rep.replaced_utf8 == 1 and rep.records == len(LINES)
        assert got[i][1] == {**rec, "pieces": [expected_piece(p) for p in pieces]}
        assert got[i][1]["pieces"][1].startswith(rec["pieces"][1] + "\ufffd")
        assert [r for n, r in got if n != i + 1] == [r for k, r in enumerate(RECORDS) if k != i]
    steps = load(log)[0].steps
    assert [s.index for s in steps] == [r["step"] for r in RECORDS if r["type"] == "step_end"]
    assert all(s.ended for s in steps)
    assert steps[0].pieces == [expected_piece(p) for p in pieces]


def test_summary_mentions_replacements(tmp_path: Path) -> None:
    clean = write_log(tmp_path, LINES, "clean.log")
    _, rep = read_all(clean)
    assert rep.replaced_utf8 == 0 and rep.summary() == ""
    lines = list(LINES)
    for i in BEGINS[:2]:
        lines[i] = step_begin_line(
            RECORDS[i], [chunks(p) + [(b"\xc0\xaf", b"\xc0\xaf")] for p in RECORDS[i]["pieces"]]
        )
    log = write_log(tmp_path, lines)
    _, rep = read_all(log)
    assert rep.replaced_utf8 == 2 and not rep.skipped
    assert rep.summary() == "2 lines read with invalid UTF-8 replaced by U+FFFD"
    # skipped lines and replacements, both in the one line
    lines.insert(3, b"{not json\n")
    _, rep = read_all(write_log(tmp_path, lines, "both.log"))
    assert rep.summary() == (
        "skipped 1 of 17 lines: 4 (invalid JSON); 2 lines read with invalid UTF-8 replaced by U+FFFD"
    )
    # the commands print it on stderr
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(tmp_path / "t.pftrace")])
    assert r.exit_code == 0, r.output
    assert "2 lines read with invalid UTF-8 replaced by U+FFFD" in r.output
    assert "4 steps" in r.output
    r = CliRunner().invoke(main, ["summary", str(log)])
    assert r.exit_code == 0 and "2 lines read with invalid UTF-8 replaced by U+FFFD" in r.output


def test_invalid_utf8_outside_strings_is_still_invalid_json(tmp_path: Path) -> None:
    """Replacement only rescues lines whose sole fault is the encoding."""
    lines = list(LINES)
    lines[2] = b"\xff" + lines[2]  # junk before the object: not JSON whatever its encoding
    lines[3] = lines[3].replace(b'"type"', b'"ty\xc0\xafpe"', 1)  # parses, but has no "type"
    log = write_log(tmp_path, lines)
    got, rep = read_all(log)
    assert rep.skipped == [(3, "invalid JSON"), (4, "not a record object")]
    assert rep.replaced_utf8 == 0 and len(got) == len(LINES) - 2
    with pytest.raises(UserError, match="line 3: invalid JSON"):
        read_all(log, strict=True)


def test_truncated_last_line_with_a_cut_character(tmp_path: Path) -> None:
    lines = list(LINES[:-1])
    lines.append(b'{"type":"session_end","ts":1,"sid":"x","note":"\xe2\x82')
    got, rep = read_all(write_log(tmp_path, lines))
    assert rep.skipped == [(len(LINES), "truncated last line")] and rep.replaced_utf8 == 0
    assert len(got) == len(LINES) - 1


_JUNK_BYTE = (
    st.integers(0x20, 0xFF).filter(lambda b: b not in (0x22, 0x5C)).map(lambda b: bytes([b]))
)
_JUNK = st.lists(st.sampled_from(BAD_UTF8) | _JUNK_BYTE, min_size=1, max_size=6).map(b"".join)


@settings(
    derandomize=True,
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    inserts=st.lists(
        st.tuples(st.sampled_from(BEGINS), st.integers(0, 10_000), st.integers(0, 10_000), _JUNK),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz_bytes_in_pieces_never_cost_a_record(
    inserts: list[tuple[int, int, int, bytes]], tmp_path: Path
) -> None:
    """Random bytes (any but those JSON forbids in a string: quote, backslash, controls) inserted
    anywhere in the pieces of step_begin lines: every record is read, with its step and fields."""
    pieces = {i: [chunks(p) for p in RECORDS[i]["pieces"]] for i in BEGINS}
    for i, which, at, junk in inserts:
        piece = pieces[i][which % len(pieces[i])]
        piece.insert(at % (len(piece) + 1), (junk, junk))
    lines = list(LINES)
    for i in BEGINS:
        lines[i] = step_begin_line(RECORDS[i], pieces[i])
    n_bad = 0
    for i in BEGINS:
        try:
            lines[i].decode("utf-8")
        except UnicodeDecodeError:
            n_bad += 1
    log = write_log(tmp_path, lines, "fuzz.log")
    for strict in (False, True):
        got, rep = read_all(log, strict=strict)
        assert [n for n, _ in got] == list(range(1, len(LINES) + 1))
        assert rep.skipped == [] and rep.replaced_utf8 == n_bad
        assert (rep.summary() != "") == (n_bad > 0)
        for k, (_, rec) in enumerate(got):
            want = RECORDS[k]
            if k in pieces:
                want = {**want, "pieces": [expected_piece(p) for p in pieces[k]]}
            assert rec == want
    steps = load(log)[0].steps
    ends = [r for r in RECORDS if r["type"] == "step_end"]
    assert [(s.index, s.ended, s.dur) for s in steps] == [(e["step"], True, e["dur"]) for e in ends]
    begins = {RECORDS[i]["step"]: i for i in BEGINS}
    for s in steps:
        if s.index in begins:
            i = begins[s.index]
            assert s.tokens == RECORDS[i]["tokens"]
            assert s.pieces == [expected_piece(p) for p in pieces[i]]
