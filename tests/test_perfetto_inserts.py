"""``merge`` places a flush's single rows among its templated blocks' rows (``inserts.plan``)
instead of sorting every row: the bytes are those of the sort (``merge_sorted``), ties on the
timestamp included, and blocks that interleave take the sort."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.formats.perfetto import merge as merge_mod
from llamacpp_instr.converters.formats.perfetto.inserts import plan
from llamacpp_instr.converters.formats.perfetto.packets import Sequence
from llamacpp_instr.converters.formats.perfetto.template import Template

pytestmark = pytest.mark.fast


def _template(rows: int, rng: np.random.Generator) -> Template:
    """A template of ``rows`` rows: strictly increasing static keys (rank, tie, seq - seq0), so
    that rows at one timestamp keep their order, and packets of 1 to 4 bytes."""
    tm = Template()
    rank = rng.integers(0, 3, rows).astype(np.int64)
    tie = rng.integers(-2, 3, rows).astype(np.int64)
    order = np.lexsort((tie, rank))
    tm.keys = (rank[order], tie[order], np.arange(rows, dtype=np.int64) * 2)
    lens = rng.integers(1, 5, rows)
    tm.row_off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    return tm


def _fills(blocks: list[tuple[int, int, int, int]], rng: np.random.Generator) -> list[Any]:
    """``TemplateSet._fill``'s tuples for blocks (template, batch, first timestamp, step
    between rows: 0 makes every row's timestamp the same), two templates."""
    tms = [_template(3, rng), _template(5, rng)]
    out = []
    for k, tm in enumerate(tms):
        mine = [b for b in blocks if b[0] == k]
        if not mine:
            continue
        n, nr = len(mine), len(tm.keys[0])
        kb = np.array([b[1] for b in mine], dtype=np.int64)
        seq0 = np.array([100 + 1000 * j + 20 * k for j in range(n)], dtype=np.int64)
        ts = np.array([[b[2] + b[3] * r for r in range(nr)] for b in mine], dtype=np.int64)
        size = int(tm.row_off[-1])
        tb = rng.integers(1, 255, (n, size)).astype(np.uint8)
        r_, t_, s_ = tm.keys
        first = [kb, ts[:, 0], np.full(n, r_[0]), np.full(n, t_[0]), seq0 + s_[0]]
        last = [kb, ts[:, -1], np.full(n, r_[-1]), np.full(n, t_[-1]), seq0 + s_[-1]]
        out.append((first, last, tb, (kb, seq0, ts, tm)))
    return out


def _singles(rows: list[tuple[int, int, int, int]]) -> tuple[list[Any], list[Any]]:
    """Key columns and bodies (``collect``'s) of single rows (batch, ts, rank, tie); their seq
    odd, so distinct from the blocks' (even)."""
    keys = [np.array([r[j] for r in rows], dtype=np.int64) for j in range(4)]
    keys.append(np.arange(len(rows), dtype=np.int64) * 2 + 1)
    bodies = tuple(bytes([7, j % 250 + 1]) for j in range(len(rows)))
    return keys, [(bodies, (-1,) * len(rows))]


def _both(first: list[Any], picked: list[Any], fills: list[Any], head: bool) -> tuple[Any, Any]:
    out = []
    for f in (merge_mod.merge, merge_mod.merge_sorted):
        seq = Sequence()
        if not head:
            seq.first = False
        data = f(first, picked, [], fills, seq)
        out.append(None if data is None else b"".join(data))
    return out[0], out[1]


_BLOCK = st.tuples(
    st.integers(0, 1), st.integers(0, 2), st.integers(0, 60), st.sampled_from([0, 1, 3])
)
_SINGLE = st.tuples(st.integers(0, 2), st.integers(0, 70), st.integers(0, 2), st.integers(-2, 2))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    blocks=st.lists(_BLOCK, min_size=1, max_size=8),
    singles=st.lists(_SINGLE, max_size=30),
    head=st.booleans(),
    seed=st.integers(0, 3),
)
@example(blocks=[(0, 0, 10, 0), (1, 0, 10, 0)], singles=[(0, 10, 1, 0)], head=False, seed=0)
def test_placed_as_sorted(
    blocks: list[tuple[int, int, int, int]],
    singles: list[tuple[int, int, int, int]],
    head: bool,
    seed: int,
) -> None:
    fills = _fills(blocks, np.random.default_rng(seed))
    first, picked = _singles(singles)
    got, want = _both(first, picked, fills, head)
    assert got == want


def test_ties_on_the_timestamp_are_placed() -> None:
    """Blocks whose rows all share one timestamp, singles at it: each goes by rank, tie, seq
    among the block rows (and ``plan`` does place them: the sort is not what answered)."""
    fills = _fills([(0, 0, 5, 0), (1, 0, 9, 0), (1, 1, 0, 2)], np.random.default_rng(1))
    rows = [(0, 5, r, t) for r in range(3) for t in (-2, 0, 2)] + [(0, 9, 1, 0), (1, 2, 1, 1)]
    first, picked = _singles(rows)
    p = plan(first, fills)
    assert p is not None
    pos = p.pos.tolist()
    assert len(set(pos)) > 3 and pos == sorted(pos)
    got, want = _both(first, picked, fills, False)
    assert got is not None and got == want


def test_interleaved_blocks_are_sorted() -> None:
    """Two blocks whose rows interleave cannot be placed into: ``plan`` gives up, the bytes are
    the sort's."""
    fills = _fills([(1, 0, 0, 3), (1, 0, 1, 3)], np.random.default_rng(2))
    first, picked = _singles([(0, 4, 1, 0)])
    assert plan(first, fills) is None
    got, want = _both(first, picked, fills, False)
    assert got == want and got is not None


def test_first_packet_a_block_row_gives_none() -> None:
    """The head must be a single row's packet: a block row first gives None, as the sort does."""
    fills = _fills([(0, 0, 5, 1)], np.random.default_rng(3))
    first, picked = _singles([(0, 9, 1, 0)])
    assert _both(first, picked, fills, True) == (None, None)
    got, want = _both(first, picked, fills, False)
    assert got == want and got is not None


def test_block_keys_too_wide_to_pack() -> None:
    """Blocks whose keys span too much to pack in one int64 are ordered column by column; the
    singles are still placed (their (batch, ts) packs)."""
    fills = _fills([(0, 0, 0, 1), (1, 0, 2**61, 1), (0, 1, 5, 0)], np.random.default_rng(4))
    first, picked = _singles([(0, 1, 1, 0), (0, 2**61 + 1, 0, 0), (1, 5, 2, 2), (0, 3, 1, 1)])
    p = plan(first, fills)
    assert p is not None and p.pos.tolist() == sorted(p.pos.tolist())
    got, want = _both(first, picked, fills, False)
    assert got == want and got is not None
