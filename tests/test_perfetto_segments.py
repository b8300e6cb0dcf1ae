"""The Perfetto writer's segments (``perfetto/segments.py``): a ``SliceRows`` kept as columns
through the flush writes the bytes its slices write one by one (``Writer.add_slice``, which
never makes segments), whatever its arg names, flows, timestamps and durations."""

from __future__ import annotations

import io
import struct
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.formats.perfetto import write_perfetto_fast
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.traces.items import Slice, SliceRows, Track

pytestmark = pytest.mark.fast

_TS = st.one_of(
    st.integers(0, 10**12),
    st.integers(-(10**6), 10**6),
    st.integers(2**62 - 10, 2**62 + 10),
    st.integers(2**63 - 10, 2**63 - 1),  # (ends past int64: the small rows' path)
)
_ROW = st.tuples(
    st.sampled_from([11, 12, 2**40 + 3]),  # track
    st.sampled_from(["copy", "a → b", "set_tensor"]),  # name
    _TS,
    st.one_of(st.integers(0, 10**7), st.just(0), st.integers(-5, 5)),  # dur
    st.dictionaries(
        st.sampled_from(["x", "y", "z"]),
        st.one_of(st.integers(0, 2**40), st.floats(allow_nan=False), st.text(max_size=3)),
        max_size=3,
    ),
    st.booleans(),  # ends a flow
)


def _trace(items: list[Any], flush_rows: int) -> bytes:
    out = io.BytesIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(perfetto_writer, "FLUSH_ROWS", flush_rows)
        write_perfetto_fast(items, out, compress=False)
    return out.getvalue()


def _items(steps: list[list[list[Any]]], whole: bool) -> list[Any]:
    """A step slice, then its SliceRows (``whole``) or their slices one by one, per step."""
    items: list[Any] = [Track(t, f"t{t}", 1, "slices") for t in (10, 11, 12, 2**40 + 3)]
    flow = 1000
    for k, step in enumerate(steps):
        items.append(Slice(10, f"step {k}", 100 * k, 50, 0, "step", {"step": k}))
        for group in step:
            rows = SliceRows("copy", 0)
            for r, (track, name, ts, dur, args, ends) in enumerate(group):
                rows.add(track, name, ts, dur, dict(args))
                if ends:
                    flow += 1
                    rows.flows_in[r] = (flow,)
            items += [rows] if whole else list(rows.items())
    return items


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    steps=st.lists(
        st.lists(st.lists(_ROW, min_size=1, max_size=8), min_size=1, max_size=3),
        min_size=1,
        max_size=6,
    ),
    flush_rows=st.sampled_from([1, 8, 32768]),
)
@example(  # a negative timestamp: framed as small rows are (10-byte varints)
    steps=[[[(11, "copy", 0, 0, {}, False)] * 3 + [(11, "copy", -1, 0, {}, False)]]],
    flush_rows=1,
)
@example(steps=[[[(11, "copy", 2**63 - 2, 5, {"x": 1}, True)]]], flush_rows=1)
def test_segments_as_slices_one_by_one(steps: list[list[list[Any]]], flush_rows: int) -> None:
    want = _trace(_items(steps, whole=False), flush_rows)
    got = _trace(_items(steps, whole=True), flush_rows)
    assert len(want) > 0
    assert got == want


def test_a_run_per_arg_names() -> None:
    """Rows whose arg names change, or the number of flows they end, split a ``SliceRows`` into
    segments (checked on what the writer's batch holds); a flow id that does not fit a fixed64
    is an error, as it is one by one."""
    from llamacpp_instr.converters.formats.perfetto.batch import Batch
    from llamacpp_instr.converters.formats.perfetto.begins import Begins
    from llamacpp_instr.converters.formats.perfetto.events import EventFields
    from llamacpp_instr.converters.formats.perfetto.packets import Interner
    from llamacpp_instr.converters.formats.perfetto.segments import add_segs

    def batch(flows: dict[int, tuple[int, ...]]) -> Any:
        rows = SliceRows("busy", 0)
        for r, args in enumerate(
            [{"a": 1}, {"a": 2, "b": 3}, {"a": 4, "b": 5}, {"a": 6, "b": 7}, {"a": 8, "b": 9}]
        ):
            rows.add(7, "command buffer", 10 * r, 5, args)
        rows.flows_in.update(flows)
        interner = Interner()
        b = Batch()
        add_segs(b, rows, Begins(interner), EventFields(interner))
        assert b.seq == 10 and b.rows == 10
        return b

    b = batch({2: (99,), 3: (98,)})
    assert [(len(sg.ts), sg.seq0) for sg in b.segs] == [(1, 0), (1, 2), (2, 4), (1, 8)]
    assert b.small == []
    with pytest.raises(struct.error):  # (as one by one: ``EventFields.begin``)
        batch({2: (2**64,)})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20))
def test_the_bulk_varints_are_the_one_by_one_varints(values: list[int]) -> None:
    """``varint_len`` and ``varint_bytes`` (the general encoder's timestamps) write each int64 as
    ``varint`` does: a negative one in ten bytes of two's complement (they once gave it one)."""
    import numpy as np

    from llamacpp_instr.converters.formats.perfetto.protowire import (
        varint,
        varint_bytes,
        varint_len,
    )

    x = np.array(values, dtype=np.int64)
    lens = varint_len(x)
    assert lens.tolist() == [len(varint(v)) for v in values]
    for nb in sorted(set(lens.tolist())):
        rows = np.flatnonzero(lens == nb)
        got = [bytes(r) for r in varint_bytes(x[rows], nb)]
        assert got == [varint(values[i]) for i in rows.tolist()]


def test_segments_of_two_encodings_in_one_flush(monkeypatch: Any) -> None:
    """A track described in the middle of a step writes what came before it, and so encodes the
    begins noted so far: the step's segments before it and after it come from two encodings
    (``GroupBytes``), whose bytes the flush's columns take each from its own."""
    from llamacpp_instr.converters.formats.perfetto import segments, templates

    seen: list[int] = []  # per flush with segments: how many encodings they come from
    real = segments.seg_columns

    def spy(batches: list[Any], events: Any) -> Any:
        segs = [sg for b in batches for sg in b.segs]
        if segs:
            seen.append(len({id(sg.grp.gb) for sg in segs}))
        return real(batches, events)

    monkeypatch.setattr(templates, "seg_columns", spy)

    def items(whole: bool) -> list[Any]:
        out: list[Any] = [Track(t, f"t{t}", 1, "slices") for t in (10, 11)]  # (12: later)
        for k in range(3):
            out.append(Slice(10, f"step {k}", 1000 * k, 500, 0, "step", {"step": k}))
            for j in range(2):
                if k == 1 and j == 1:  # (a new track between the step's two SliceRows)
                    out.append(Track(12, "t12", 1, "slices"))
                rows = SliceRows("copy", 0)
                for r in range(3):
                    rows.add(11 + j, f"copy {j}", 1000 * k + 100 * j + 10 * r, 5, {"n": r, "j": j})
                out += [rows] if whole else list(rows.items())
        return out

    want = _trace(items(whole=False), 32768)
    seen.clear()
    got = _trace(items(whole=True), 32768)
    assert len(want) > 0
    assert got == want
    assert 2 in seen  # (the case this is about was met)
