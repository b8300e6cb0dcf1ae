"""Templates: a compute seen again (every generation step) written from its previous packets.

A compute's rows (its slice, its layers' and its ops' begins and ends) form a ``Block`` of the
``Batch`` of its step. Once a block of the same key (track, args, layers, op variants) has been
seen twice, its packets are kept as bytes (a ``Template``) with the positions of every timestamp
and rate; a later block whose rows sort in the same order is written by copying the template and
putting its own timestamps and rates in place, thousands of packets in a few numpy operations.
A template is made in ``template`` and filled in ``template_fill``; here, the templates learnt
(``TemplateSet``) and a flush's batches encoded from them.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

import numpy as np

from ...traces.sinks import Data
from .batch import Batch, Block
from .events import EventFields
from .merge import merge
from .ops import OpStore, RateFields
from .packets import Sequence
from .segments import materialize, seg_columns
from .singles import FEW_ROWS, collect, frame_rows, interleaved, join_units
from .template import Template, make_template
from .template_fill import fill

TEMPLATE_BYTES = 64 << 20  # templates kept, at most (then forgotten, and learnt again)


class TemplateSet:
    """The templates learnt so far (``learn``), and the batches encoded from them (``encode``)."""

    def __init__(
        self, store: OpStore, fields: RateFields, events: EventFields, seq: Sequence
    ) -> None:
        self.store = store
        self.fields = fields
        self.events = events
        self.seq = seq
        # per block key: its template, or how many times it was seen without one
        self.templates: dict[tuple[Any, ...], Template | int] = {}
        self.bytes = 0  # the templates' size
        self.templated = 0  # blocks encoded from a template

    def clear(self) -> None:
        self.templates.clear()
        self.bytes = 0

    def encode(self, batches: list[Batch]) -> Data | None:
        """The batches' packets with each compute from its template and the other rows framed
        in bulk (``singles``), or None if a compute has no template or its rows do not sort as
        the template's, or the first packet would be a compute's (the general encoder writes
        those)."""
        got = by_templates(batches, self.templates, self.events)
        if got is None:
            return None
        by_template, blocks, keys, first, picked, sc = got
        ends = self.events.ends
        n_s = len(first[0])
        fills = fill(list(by_template.values()), self.store)
        if fills is None:
            return None
        # single rows inside templated computes (a device's busy stretches) are merged row by
        # row, as are many single rows (a device log's: ``merge`` places them among the blocks'
        # rows, wherever they fall); a few not inside (a CPU log's) cost less one by one
        few = n_s < FEW_ROWS * blocks
        inter = few and bool(n_s) and interleaved(first[0], first[1], by_template.values())
        if few and not inter:
            if len(sc):  # (``join_units`` takes small rows)
                return self.encode([materialize(b, self.events) for b in batches])
            units = join_units(keys, frame_rows(picked, ends, None)[0], fills, self.seq)
            if units is not None:
                self.templated += blocks
                return units
        data = merge(first, picked, ends, fills, self.seq, sc)
        self.templated += blocks if data is not None else 0
        return data

    def learn(self, batches: list[Batch]) -> None:
        """Templates for the blocks seen more than once (a few tries each)."""
        if len(self.templates) > 4096 or self.bytes > TEMPLATE_BYTES:
            self.clear()
        for b in batches:
            for bl in b.blocks:
                v = self.templates.get(bl.key, 0)
                if isinstance(v, Template):
                    continue
                v += 1
                tm = (
                    make_template(b, bl, self.store, self.fields, self.events)
                    if 2 <= v <= 4
                    else None
                )
                self.templates[bl.key] = tm if tm is not None else v
                if tm is not None:
                    self.bytes += len(tm.buf)


def by_templates(batches: list[Batch], templates: dict[Any, Any], events: EventFields) -> Any:
    """For ``TemplateSet.encode``: the blocks of ``batches`` by template, their number, the
    single rows' keys (lists: batch, ts, rank, tie, seq) and the same as arrays with the
    segments' rows after the others (``segments.seg_columns``), what makes the single rows'
    bodies (``singles.collect``) and the segments' columns; None if a block has no template, a
    group no block, or a timestamp is out of range."""
    by_template: dict[int, tuple[Template, list[tuple[int, Batch, Block]]]] = {}
    blocks = 0
    keys: list[list[Any]] = [[] for _ in range(5)]  # the single rows' batch, ts, rank, tie, seq
    picked: list[tuple[Any, Any]] = []  # the single rows' S and end id columns
    singles: list[Any] = []  # every batch's small rows not in a block, in one list
    batch_of: list[int] = []  # the number of each one's batch
    for k, b in enumerate(batches):
        small = b.small
        single = bytearray(b"\x01") * len(small)
        groups = 0
        for bl in b.blocks:
            tm = templates.get(bl.key)
            if not isinstance(tm, Template):
                return None
            got = by_template.get(id(tm))
            if got is None:
                got = by_template[id(tm)] = (tm, [])
            got[1].append((k, b, bl))
            blocks += 1
            single[bl.i0] = single[bl.i0 + 1] = 0
            groups += bl.group >= 0
        if groups != len(b.groups):
            return None
        n0 = len(singles)
        singles += compress(small, single)
        batch_of += [k] * (len(singles) - n0)
    if not collect(singles, batch_of, keys, picked):
        return None
    sc = seg_columns(batches, events)
    if sc is None:
        return None
    first = [np.concatenate((np.array(c, np.int64), z)) for c, z in zip(keys, sc.keys, strict=True)]
    return by_template, blocks, keys, first, picked, sc
