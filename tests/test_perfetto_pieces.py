"""``perfetto.pieces``: rows assembled in bulk are the rows made one by one."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.traces.perfetto.pieces import Pieces
from llamacpp_instr.converters.traces.perfetto.protowire import varint

# a part: ("const", bytes) | ("varint", ints) | ("pick", values, codes) | ("f64", floats)
_VALUES = st.lists(st.binary(min_size=1, max_size=80), min_size=1, max_size=4)


def _part(n: int) -> Any:
    return st.one_of(
        st.tuples(st.just("const"), st.binary(max_size=5)),
        st.tuples(st.just("varint"), st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)),
        _VALUES.flatmap(
            lambda vals: st.tuples(
                st.just("pick"),
                st.just(vals),
                st.lists(st.integers(0, len(vals) - 1), min_size=n, max_size=n),
            )
        ),
        st.tuples(st.just("f64"), st.lists(st.floats(), min_size=n, max_size=n)),
    )


def _by_hand(n: int, parts: list[Any]) -> list[bytes]:
    rows = [b""] * n
    for p in parts:
        for r in range(n):
            if p[0] == "const":
                rows[r] += p[1]
            elif p[0] == "varint":
                rows[r] += varint(p[1][r])
            elif p[0] == "pick":
                rows[r] += p[1][p[2][r]]
            else:
                rows[r] += struct.pack("<d", p[1][r])
    return rows


def _built(n: int, parts: list[Any]) -> list[bytes]:
    pc = Pieces(n)
    for p in parts:
        if p[0] == "const":
            pc.const(p[1])
        elif p[0] == "varint":
            pc.varint(np.array(p[1], dtype=np.int64))
        elif p[0] == "pick":
            pc.pick(np.array(p[2], dtype=np.int64), p[1])
        else:
            pc.f64(np.array(p[1], dtype=np.float64))
    out, lens = pc.build()
    data = out.tobytes()
    ends = np.cumsum(lens).tolist()
    return [data[a:z] for a, z in zip([0] + ends[:-1], ends, strict=True)]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(st.just(n), st.lists(_part(n), max_size=6))))
def test_rows_in_bulk_as_by_hand(case: tuple[int, list[Any]]) -> None:
    """Constants (merged when consecutive), varints, picks (padded where a row has room for the
    longest value, byte by byte where not, both in one pick) and float64s."""
    n, parts = case
    assert _built(n, parts) == _by_hand(n, parts)


def test_pick_with_room_in_some_rows_only() -> None:
    """A pick whose longest value overruns some rows' ends but not others': each row gets its
    own value, and the rows after it are untouched."""
    vals = [b"a" * 40, b"bb", b"c" * 10]
    codes = [0, 1, 2, 1, 0]
    tail = [[b"x" * 50, b"", b"y", b"z" * 45, b""][r] for r in range(5)]
    parts = [("const", b"\x01"), ("pick", vals, codes), ("pick", tail, list(range(5)))]
    rows = _built(5, parts)
    assert rows == [b"\x01" + vals[c] + t for c, t in zip(codes, tail, strict=True)]
    room = [len(t) + len(vals[c]) for c, t in zip(codes, tail, strict=True)]
    assert min(room) < 40 <= max(room)  # (both kinds of row)
