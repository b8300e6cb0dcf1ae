"""The Perfetto writer's begins of computes' device parts (``perfetto/events.py``): kept by
their track, name and args (what the part is: ubatch, graph, device, number of ops), each the
bytes its own encoding makes, interning what that interns in the same order."""

from __future__ import annotations

import pytest

from llamacpp_instr.converters.formats.perfetto.events import EventFields
from llamacpp_instr.converters.formats.perfetto.packets import Interner
from llamacpp_instr.converters.traces.items import Slice

pytestmark = pytest.mark.fast


def _part(track: int, device: str, n_ops: int, ts: int, flows: tuple[int, ...] = ()) -> Slice:
    args = {"ubatch": 0, "graph": 2, "device": device, "n_ops": n_ops}
    return Slice(track, "compute ubatch 0", ts, 5, 1, "device", args, flows)


def test_device_parts_kept_by_what_they_are() -> None:
    kept, fresh = EventFields(Interner()), EventFields(Interner())
    parts = [
        _part(7, "CPU", 220, 0),
        _part(8, "RPC0", 201, 10),
        _part(7, "CPU", 220, 100),  # (the next step's: kept)
        _part(7, "CPU", 221, 200),  # (another number of ops: its own)
        _part(8, "RPC1", 201, 300),  # (another device on the same track: its own)
        _part(9, "CPU", 220, 400),  # (another track: its own)
        _part(7, "CPU", 220, 500, (42,)),  # (a flow: never kept, its id is in the bytes)
    ]
    got = [kept.begin(p) for p in parts]
    want = []
    for p in parts:  # each encoded afresh, in the same order (so interning the same)
        want.append(fresh._begin(p))
    assert got == want
    assert got[2] is got[0]  # (kept)
    assert len(set(got)) == 6  # (all but the kept one differ)
    assert kept.interner.pending == fresh.interner.pending
    assert len(kept.parts) == 5
