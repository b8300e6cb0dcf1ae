"""``singles.framed`` frames many rows at once: each row's bytes are ``packets.packet(body +
TIMESTAMP + varint(ts) + POST)``, as one row at a time writes them, whatever the lengths of the
bodies and of the timestamps' varints (all one length, or mixed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.formats.perfetto.packets import POST, packet
from llamacpp_instr.converters.formats.perfetto.protowire import TIMESTAMP, varint
from llamacpp_instr.converters.formats.perfetto.singles import framed

pytestmark = pytest.mark.fast

_TS = st.one_of(
    st.integers(0, 300),
    st.integers(2**49 - 3, 2**49 + 3),  # (varints of 7 and 8 bytes)
    st.integers(2**56 - 2, 2**56 + 2),
    st.integers(2**63 - 3, 2**63 - 1),
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    rows=st.lists(
        st.tuples(st.binary(min_size=0, max_size=300), _TS),
        min_size=1,
        max_size=12,
    ),
    even=st.booleans(),
)
def test_framed_as_one_by_one(rows: list[tuple[bytes, int]], even: bool) -> None:
    if even:  # (every timestamp's varint as long as the first's)
        rows = [(b, rows[0][1]) for b, _ in rows]
    bodies = [b for b, _ in rows]
    ts = np.array([t for _, t in rows], dtype=np.int64)
    want = [packet(b + TIMESTAMP + varint(t) + POST) for b, t in rows]
    buf, plen = framed(bodies, ts)
    assert buf.tobytes() == b"".join(want)
    assert plen.tolist() == [len(p) for p in want]


def test_bodies_ending_in_zero_bytes() -> None:
    """A body's last byte may be zero (only the glue between bodies is kept in fixed-width
    strings): long bodies (two-byte lengths) and short ones mixed."""
    bodies = [b"\x08\x00", bytes(200), b"\x01", bytes(130) + b"\x05", b"\x00"]
    ts = np.array([5, 7, 7, 2**40, 2**40 + 1], dtype=np.int64)
    for _ in range(2):
        pk = [
            packet(b + TIMESTAMP + varint(int(t)) + POST) for b, t in zip(bodies, ts, strict=True)
        ]
        assert framed(bodies, ts)[0].tobytes() == b"".join(pk)
        ts[:] = 2**40  # (then all one length)
