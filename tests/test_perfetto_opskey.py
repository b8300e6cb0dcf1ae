"""A device's part of a compute (``Writer.add_ops``, ``NodeTables.kept``): rows are made only
for the ops the part keeps, yet the strings are interned as a build of the whole compute on its
first track interned them, and the rows are those that build gave; the part of a block's key that
names the ops is the same exactly where the kept ops are."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from llamacpp_instr.converters.formats.perfetto.ops import (
    NodeTables,
    OpStore,
    RateFields,
    StaticSet,
)
from llamacpp_instr.converters.formats.perfetto.packets import Interner
from llamacpp_instr.converters.formats.perfetto.protowire import (
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_SLICE_BEGIN,
    varint,
)
from llamacpp_instr.converters.formats.perfetto.writer import Writer
from llamacpp_instr.converters.traces.op_args import OpVariants
from tests.test_op_static_args import GRAPH

pytestmark = pytest.mark.fast

NODE = np.array([3, 1, 4, 1, 0, 2], dtype=np.int64)
FUSED = {1: [2], 3: [2], 4: [2, 3]}  # op position -> fused node indices (1+2 twice)
# the parts of one compute: three tracks, each a slice of its ops (the middle one: both 1+2s)
PARTS = [(11, slice(0, 1)), (12, slice(1, 4)), (13, slice(4, 6))]


def tables(compact: bool = False) -> tuple[NodeTables, OpStore, Interner]:
    it = Interner()
    store = OpStore()
    return NodeTables(store, RateFields(it), it, compact), store, it


def whole_builds(compact: bool) -> tuple[Interner, dict[int, list[bytes]]]:
    """The interner and each track's op S parts of builds of the whole compute on every track,
    as the writer made them before parts: ``OpVariants`` gives the variants in order, each static
    made on first use (``StaticSet.static``), S the track's prefix and the static's start."""
    t, _, it = tables(compact)
    statics: dict[Any, Any] = {}
    ss = StaticSet(t, GRAPH, None)
    rows: dict[int, list[bytes]] = {}
    for track, _ in PARTS:
        t.fields.setup(2)
        prefix = TE_TRACK_UUID + varint(track) + TE_TYPE + varint(TYPE_SLICE_BEGIN)
        made: list[bytes] = []

        def build(vs: list[Any], prefix: bytes = prefix, made: list[bytes] = made) -> list[int]:
            for v in vs:
                if v not in statics:
                    statics[v] = ss.static(*v)
                st = statics[v]
                made.append(TRACK_EVENT + varint(len(prefix) + st[7]) + prefix + st[0])
            return list(range(len(made) - len(vs), len(made)))

        ids = OpVariants(len(GRAPH.nodes), build).ids(NODE, FUSED)
        rows[track] = [made[g] for g in ids.tolist()]
    return it, rows


def test_parts_intern_as_whole_builds_and_make_only_their_rows() -> None:
    for compact in (False, True):
        w_it, w_rows = whole_builds(compact)
        part, p_store, p_it = tables(compact)
        for track, keep in PARTS:
            gids, _ = part.kept(GRAPH, track, None, NODE, FUSED, keep)
            assert len(gids) == len(NODE[keep])
            # the rows the whole build gave these ops (S names the track)
            assert [p_store.s[g] for g in gids.tolist()] == w_rows[track][keep]
        # the same strings, with the same ids, in the same order
        assert p_it.pending == w_it.pending and p_it.pending
        assert (p_it.names, p_it.arg_names, p_it.strings) == (
            w_it.names,
            w_it.arg_names,
            w_it.strings,
        )
        assert bool(p_it.strings) == compact
        # one row per distinct variant a part keeps: 3; 1+2, 4; 0+2+3, 2 (the whole builds
        # made all seven on every track: 0 to 4, 1+2, 0+2+3)
        assert len(p_store.s) == 1 + 2 + 2


def test_a_part_that_keeps_nothing_still_interns() -> None:
    w_it, _ = whole_builds(False)
    part, p_store, p_it = tables()
    gids, _ = part.kept(GRAPH, 11, None, NODE, FUSED, slice(2, 2))
    assert len(gids) == 0 and not p_store.s
    assert p_it.pending == w_it.pending and p_it.pending


def _writer() -> Writer:
    return Writer(io.BytesIO(), False)


def _ob(track: int, node: Any, keep: Any, fused: Any = FUSED) -> Any:
    c = SimpleNamespace(
        graph=GRAPH,
        op_node=node,
        op_fused=fused,
        op_start=np.arange(len(node), dtype=np.int64) * 10,
        op_dur=np.arange(len(node), dtype=np.int64) + 1,
    )
    return SimpleNamespace(compute=c, track=track, roof=None, keep=keep)


def test_ops_key_names_the_kept_ops() -> None:
    changed = np.array([3, 1, 4, 1, 0, 1], dtype=np.int64)
    mask = np.array([True, False, True, False, False, True])
    cases = [
        (1, NODE, slice(0, 3)),
        (1, NODE, slice(0, 3)),  # the same compute again: the same key
        (2, NODE, slice(0, 3)),  # another track
        (1, NODE.copy(), slice(0, 3)),  # an equal new array: an equal key
        (1, changed, slice(3, 6)),  # another compute
        (1, changed, slice(2, 6)),  # another slice
        (1, NODE, slice(3, 6)),  # the first compute, another slice: the same ops as case 4's
        (1, NODE, None),
        (1, NODE, mask),
        (1, NODE, np.ones(6, dtype=bool)),  # every op: the same ops as without a mask
    ]
    w = _writer()
    keys = [w.add_ops(_ob(track, node, keep)) for track, node, keep in cases]
    groups = w.cur.groups
    assert len(groups) == len(cases)
    # each op's variant (track, node, fused nodes), independently of the gids
    variants = []
    for track, node, keep in cases:
        pos = np.arange(len(node))[slice(None) if keep is None else keep].tolist()
        variants.append([(track, int(node[k]), tuple(FUSED.get(k, ()))) for k in pos])
    for (_, node, keep), g, v in zip(cases, groups, variants, strict=True):
        kept = np.arange(len(node))[slice(None) if keep is None else keep]
        assert g[2].tolist() == (kept * 10).tolist() and g[3].tolist() == (kept + 1).tolist()
        assert len(g[1]) == len(v)
    # a gid names one variant; keys are equal only where the kept variants are
    seen: dict[int, Any] = {}
    for g, v in zip(groups, variants, strict=True):
        for gid, var in zip(g[1].tolist(), v, strict=True):
            assert seen.setdefault(gid, var) == var
    for x in range(len(cases)):
        for y in range(len(cases)):
            if keys[x] == keys[y]:
                assert variants[x] == variants[y], (x, y)
    assert keys[1] == keys[0] and keys[3] == keys[0]
    assert keys[2] != keys[0] and keys[4] != keys[5] and keys[4] != keys[0]
    assert keys[7] == keys[9]  # (as bytes of the gids: a mask keeping all names all)
    assert isinstance(keys[8], bytes) and keys[8] == groups[8][1].tobytes()
