"""The rows of the trace, gathered a step at a time until a flush encodes them.

Every event is a row with a sort key: batch (its step), timestamp, rank (at one timestamp: slice
ends, then begins, then counter samples and the ends of zero-length slices), a depth tiebreak and
a sequence number (the order the layout made them in). A ``Batch`` holds a step's rows: "small" rows as tuples with their
bytes, each compute's ops as one group of arrays, and each compute's rows as a ``Block``, which
a template may encode whole (``templates``).
"""

from __future__ import annotations

from typing import Any

from ...traces.items import ComputeBatch
from .segments import Seg


class Block:
    """A compute's rows in a batch: its slice's two (small rows ``i0``, ``i0 + 1``), its layers'
    (seq ``seq0 + 2`` on, as small rows only once the writer expands them) and its op group's
    (``group``, or -1); ``key`` says what a template for it must have been made from."""

    __slots__ = ("seq0", "i0", "group", "cb", "key")

    def __init__(
        self, seq0: int, i0: int, group: int, cb: ComputeBatch, key: tuple[Any, ...]
    ) -> None:
        self.seq0, self.i0, self.group, self.cb, self.key = seq0, i0, group, cb, key


class Batch:
    """The rows of one step (a step slice and what follows it up to the next), not yet sorted."""

    def __init__(self) -> None:
        # small rows: ts, rank, tie, seq, S (begin-like) or b"", end id (end rows) or -1
        self.small: list[tuple[int, int, int, int, bytes, int]] = []
        self.groups: list[tuple[int, Any, Any, Any, int]] = []  # seq0, gids, start, dur, end id
        self.blocks: list[Block] = []  # computes' rows, for templates
        self.segs: list[Seg] = []  # device rows kept as columns (``segments``)
        self.seq = 0
        self.rows = 0

    def __bool__(self) -> bool:
        return self.rows > 0
