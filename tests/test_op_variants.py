"""Op variants built in bulk (``OpVariants``' builder given all of a compute's new variants at
once, ``NodeTable.build_many``) give the ids, rows and interned strings that building them one
at a time gives, in the same order; ``NodeTables.restart`` keeps ``op_static_args`` but not
what depends on interning."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llamacpp_instr.converters.formats.perfetto import ops
from llamacpp_instr.converters.formats.perfetto.ops import NodeTables, OpStore, RateFields
from llamacpp_instr.converters.formats.perfetto.packets import Interner
from llamacpp_instr.converters.formats.perfetto.protowire import TE_TRACK_UUID, TRACK_EVENT, varint
from llamacpp_instr.converters.traces import op_args
from llamacpp_instr.converters.traces.op_args import OpVariants
from tests.test_op_static_args import GRAPH

pytestmark = pytest.mark.fast

NODE = np.array([3, 1, 4, 1, 0], dtype=np.int64)
FUSED = {1: [2], 3: [2], 4: [2, 3]}  # op position -> fused node indices (1+2 twice)


def test_bulk_and_single_builds_agree_on_order() -> None:
    one: list[tuple[int, tuple[int, ...]]] = []
    many: list[tuple[int, tuple[int, ...]]] = []

    def build(i: int, f: tuple[int, ...]) -> int:
        one.append((i, f))
        return 100 + len(one)

    def build_many(vs: list[tuple[int, tuple[int, ...]]]) -> list[int]:
        many.extend(vs)
        return [100 + len(many) - len(vs) + k + 1 for k in range(len(vs))]

    a = OpVariants(5, lambda vs: [build(*v) for v in vs]).ids(NODE, FUSED)
    b = OpVariants(5, build_many).ids(NODE, FUSED)
    # plain nodes by index, then each new fused variant once, by op position
    assert one == many == [(0, ()), (1, ()), (3, ()), (4, ()), (1, (2,)), (0, (2, 3))]
    assert a.tolist() == b.tolist() == [103, 105, 104, 105, 106]


def tables() -> tuple[NodeTables, OpStore, Interner]:
    it = Interner()
    store = OpStore()
    return NodeTables(store, RateFields(it), it, False), store, it


def test_tracks_share_statics_and_keep_their_uuid() -> None:
    t, store, it = tables()
    g1 = t.kept(GRAPH, 11, None, NODE, FUSED, None)[0].tolist()
    names = dict(it.arg_names)
    g2 = t.kept(GRAPH, 300, None, NODE, FUSED, None)[0].tolist()
    assert it.arg_names == names  # the second track interns nothing new
    # four rows each: 3, 4, 1+2, 0+2+3 (nodes 0 and 1 only come fused: no plain rows)
    assert len(store.s) == 8 and max(g1) < 4 <= min(g2)
    for a, b in zip(g1, g2, strict=True):
        assert store.t[a] == store.t[b]
        # S: TrackEvent's tag, its length (a varint: the rest of S, D and T), track_uuid
        # (field 11), the rest
        sa, sb = store.s[a], store.s[b]
        for w in (1, 2, 3):
            te = sa[len(TRACK_EVENT) + w :]
            if sa[: len(TRACK_EVENT) + w] == TRACK_EVENT + varint(
                len(te) + store.dlen[a] + len(store.t[a])
            ):
                break
        else:
            raise AssertionError("no length found")
        assert te.startswith(TE_TRACK_UUID + varint(11))
        te = TE_TRACK_UUID + varint(300) + te[len(TE_TRACK_UUID) + 1 :]
        assert sb == TRACK_EVENT + varint(len(te) + store.dlen[b] + len(store.t[b])) + te


def test_restart_keeps_static_args_only(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = op_args.op_static_args

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(ops, "op_static_args", counted)
    t, store, it = tables()
    t.kept(GRAPH, 11, None, NODE, FUSED, None)  # (every op: keep None)
    assert len(calls) == 6
    loose = store.s[-1]
    t.restart(compact=True)
    t.kept(GRAPH, 11, None, NODE, FUSED, None)  # (every op: keep None)
    assert len(calls) == 6  # the args came from before the restart
    assert it.strings  # but compact statics were made anew: string values interned
    assert store.s[-1] != loose
