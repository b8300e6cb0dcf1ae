"""``perfetto.pieces``: rows assembled in bulk (many groups, one gather) are the rows made one
by one, whatever the groups, their pieces, and the assemblies before them."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.formats.perfetto.pieces import Assembly, Scratch, Table, int_heads
from llamacpp_instr.converters.formats.perfetto.protowire import ld, varint

pytestmark = pytest.mark.fast

TAG = b"\x5a"
# a piece: ("const", bytes) | ("table", values) | ("int", name, ints) | ("f64", floats)
_WORDS = st.sampled_from([b"a", b"bb", b"c" * 40, b"d" * 200, b"\x00\xff"])


def _piece(n: int) -> Any:
    return st.one_of(
        st.tuples(st.just("const"), st.binary(max_size=5)),
        st.tuples(st.just("table"), st.lists(_WORDS, min_size=n, max_size=n)),
        st.tuples(
            st.just("int"),
            st.binary(min_size=1, max_size=4),
            st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n),
        ),
        st.tuples(st.just("f64"), st.lists(st.floats(), min_size=n, max_size=n)),
    )


_GROUP = st.integers(1, 5).flatmap(lambda n: st.tuples(st.just(n), st.lists(_piece(n), max_size=6)))


def _by_hand(n: int, pieces: list[Any]) -> list[bytes]:
    rows = [b""] * n
    for p in pieces:
        for r in range(n):
            if p[0] == "const":
                rows[r] += p[1]
            elif p[0] == "table":
                rows[r] += p[1][r]
            elif p[0] == "int":
                v = varint(p[2][r])
                rows[r] += TAG + bytes([len(p[1]) + len(v)]) + p[1] + v
            else:
                rows[r] += struct.pack("<d", p[1][r])
    return [ld(TAG, r) for r in rows]


def _built(groups: list[Any], table: Table, scratch: Scratch) -> list[bytes]:
    asm = Assembly(TAG, scratch)
    firsts = []
    for n, pieces in groups:
        made: list[tuple[Any, ...]] = []
        for p in pieces:
            if p[0] == "const":
                made.append(("c", p[1]))
            elif p[0] == "table":  # (the entry of a value: the value itself)
                made.append(("t", table, table.codes(p[1], lambda v: v)))
            elif p[0] == "int":
                made.append(("i", int_heads(TAG, p[1]), np.array(p[2], dtype=np.int64)))
            else:
                f = np.array(p[1], dtype="<f8")
                made.append(("8", f.view(np.uint8).reshape(-1, 8)))
        firsts.append(asm.add(n, made))
    out, starts, lens = asm.build()
    data = out.tobytes()
    assert firsts == np.cumsum([0] + [n for n, _ in groups])[:-1].tolist()
    return [data[a : a + ln] for a, ln in zip(starts.tolist(), lens.tolist(), strict=True)]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.lists(_GROUP, max_size=4), min_size=1, max_size=3))
def test_rows_in_bulk_as_by_hand(assemblies: list[list[Any]]) -> None:
    """Constants (merged when consecutive, empty ones dropped), table entries, int annotations
    (negative ones in ten bytes) and float64s, in groups of any number of pieces (none
    included), assembled one after another with a table and a scratch buffer kept between
    them (longer or shorter than the next rows)."""
    table, scratch = Table(), Scratch()
    for groups in assemblies:
        want = [row for n, pieces in groups for row in _by_hand(n, pieces)]
        assert _built(groups, table, scratch) == want


def test_table_codes_and_entries() -> None:
    """A table gives each value a code the first time it is met, its entry made once, and a
    constant's entry is the same table's."""
    made: list[Any] = []

    def enc(v: Any) -> bytes:
        made.append(v)
        return str(v).encode()

    t = Table()
    assert t.codes(["x", "y", "x"], enc).tolist() == [0, 1, 0]
    assert t.codes(["y", "z", "x", "z"], enc).tolist() == [1, 2, 0, 2]
    assert t.entry("w", enc) == b"w" and t.entry("y", enc) == b"y"
    assert t.codes(["w"], enc).tolist() == [3]
    assert made == ["x", "y", "z", "w"] and len(t) == 4
    blob, starts, lens = t.arrays()
    assert blob.tobytes() == b"xyzw" and starts.tolist() == [0, 1, 2, 3]
    assert lens.tolist() == [1, 1, 1, 1]


def test_long_rows_lengths() -> None:
    """Rows of 128 bytes and more: their length is a varint of two bytes."""
    table, scratch = Table(), Scratch()
    groups = [(3, [("table", [b"d" * 200, b"a", b"c" * 128])])]
    rows = _built(groups, table, scratch)
    assert rows == _by_hand(*groups[0])
    assert [len(r) for r in rows] == [203, 3, 131]
