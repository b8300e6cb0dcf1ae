"""The part of a compute block's key that names its ops (``Writer.add_ops``): where the ops are
a slice of the compute's, the bytes of all the compute's gids (kept with the gids array they
were made from, per track) and the slice. Blocks share a template only if their ops' gids are
the same: a new array, a changed one or another slice gives another key."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import numpy as np

from llamacpp_instr.converters.traces.perfetto.writer import Writer


def _writer(arrays: list[Any]) -> Writer:
    w = Writer(io.BytesIO(), False)
    it = iter(arrays)
    w.tables.ids = lambda *a: next(it)  # type: ignore[method-assign]
    return w


def _ob(track: int, keep: Any) -> Any:
    c = SimpleNamespace(
        graph=object(),
        op_node=None,
        op_fused=None,
        op_start=np.arange(6, dtype=np.int64),
        op_dur=np.ones(6, dtype=np.int64),
    )
    return SimpleNamespace(compute=c, track=track, roof=None, keep=keep)


def _gids(g: Any, key: Any) -> list[int]:
    """The gids a key names (independently of how it was made)."""
    if isinstance(key, bytes):
        return np.frombuffer(key, dtype=np.int64).tolist()
    full = np.frombuffer(key[0], dtype=np.int64)
    return full[slice(*key[1:])].tolist()


def test_ops_key_names_the_kept_gids() -> None:
    a = np.array([5, 6, 7, 8, 9, 10], dtype=np.int64)
    same = a.copy()
    changed = np.array([5, 6, 7, 8, 9, 11], dtype=np.int64)
    mask = np.array([True, False, True, False, False, True])
    cases = [
        (1, a, slice(0, 3)),
        (1, a, slice(0, 3)),  # the same array: the same key, the bytes not made again
        (2, a, slice(0, 3)),  # another track
        (1, same, slice(0, 3)),  # an equal new array: an equal key
        (1, changed, slice(3, 6)),  # a changed array
        (1, changed, slice(2, 6)),  # another slice
        (1, a, None),
        (1, a, mask),
    ]
    w = _writer([g for _, g, _ in cases])
    keys = [w.add_ops(_ob(track, keep)) for track, _, keep in cases]
    for (_, g, keep), key in zip(cases, keys, strict=True):
        want = g if keep is None else g[keep]
        assert _gids(g, key) == want.tolist()
    assert keys[1] == keys[0] and keys[1][0] is keys[0][0]
    assert keys[3] == keys[0]
    assert keys[4] != keys[5] and keys[4] != keys[0]
    # each key's gids differ from another's exactly where the keys differ
    for x in range(len(cases)):
        for y in range(len(cases)):
            same_ops = _gids(cases[x][1], keys[x]) == _gids(cases[y][1], keys[y])
            if keys[x] == keys[y]:
                assert same_ops
    # the rows: one group per call, the kept ops' gids
    kept = [_gids(c[1], k) for c, k in zip(cases, keys, strict=True)]
    assert [g[1].tolist() for g in w.cur.groups] == kept
