"""KV-cache flows: from each op that writes K or V cells to the later ops that read those cells.

A ``kv_write`` op (``SET_ROWS`` into ``cache_k_l0``, ...) stores the batch's keys or values. Every
later ``kv_read`` op of the same cache (``kq-0``, ``kqv-0``, or ``FLASH_ATTN_EXT``) attends over
them, in the same compute and in every later step, until the cells are removed. So each (write,
read) pair becomes one flow, and a trace viewer shows, for a write, the attention ops that consumed
it and, for a read, the writes of the cells it read.

Cells are followed by sequence position, as llama.cpp keeps them: a step whose batch starts
sequence ``q`` at position ``p`` (a new prompt, or llama-cpp-python reusing a cached prefix)
has removed the cells of ``q`` from ``p`` on, so the writes of ``q`` that started at ``p`` or
later are gone (a write partly kept stays live: its earlier cells are still read). A read
consumes the live writes of the sequences in its step. For a batch of several sequences split
into ubatches, each ubatch is taken to hold all of the step's sequences (the log does not say how
llama.cpp split them); a single sequence's ubatches have their exact positions.

Flow ids are numbered so that a trace can be written in one pass over the log once the number of
readers of each write is known: ``count`` makes a first pass (the same walk, counting), and the
writer's pass hands out, for write ``a`` with ``n`` readers, the ids ``base[a] + 1 .. base[a] +
n``: the write starts them all, and its ``k``-th reader ends id ``base[a] + k + 1``. There is one
flow per pair, so a trace of ``N`` steps through ``L`` layers holds about ``L * N**2`` flows:
choose a layer (or a range of steps) for long runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from ..reading.decode.computes import Compute
from ..reading.decode.graphs import Graph
from ..reading.decode.sessions import Event, StepDone
from ..reading.decode.steps import Step
from . import derive

# per op position in a compute: (ids of flows it starts, ids of flows it ends)
OpFlows = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]


@dataclass
class _Write:
    index: int  # in walk order, over the whole trace
    seqs: dict[int, int]  # sequence -> first position written (while any of its cells lives)
    readers: int = 0


@dataclass
class _Roles:
    """A graph's KV roles: per node, the caches it writes and reads; which nodes have any."""

    writes: list[tuple[str, ...]]
    reads: list[tuple[str, ...]]
    any: Any  # bool array per node


@dataclass
class _Session:
    live: dict[tuple[int, str], list[_Write]] = field(default_factory=dict)  # (ctx, cache)
    roles: dict[Graph, _Roles] = field(default_factory=dict)


class KvFlows:
    """The walk that pairs KV-cache writes with their readers (see the module doc).

    ``counts``: readers per write, from a counting walk (``count``) over the same events with the
    same ``layer`` and step choice; without it the walk only counts (``self.counts``)."""

    def __init__(self, layer: int | None = None, counts: list[int] | None = None) -> None:
        self.layer = layer
        self.counting = counts is None
        self.counts: list[int] = [] if counts is None else counts
        self.base = [0, *accumulate(self.counts)]
        self.sessions: dict[str, _Session] = {}
        self.n_writes = 0

    @property
    def total(self) -> int:
        """Flows in the trace (known after the counting walk)."""
        return self.base[-1]

    def _roles(self, s: _Session, graph: Graph) -> _Roles:
        r = s.roles.get(graph)
        if r is None:
            writes: list[tuple[str, ...]] = []
            reads: list[tuple[str, ...]] = []
            for node in graph.nodes:
                ok = self.layer is None or node.layer == self.layer
                w = "kv_write" in node.flags and ok
                rd = "kv_read" in node.flags and ok
                caches = derive.kv_caches(node, graph) if w or rd else ()
                writes.append(caches if w else ())
                reads.append(caches if rd else ())
            flags = np.array([bool(a or b) for a, b in zip(writes, reads, strict=True)], dtype=bool)
            r = s.roles[graph] = _Roles(writes, reads, flags)
        return r

    def step(self, sid: str, step: Step, wanted: bool = True) -> list[OpFlows]:
        """The flows of each of the step's computes (empty for a step not ``wanted`` in the
        trace, whose removals of cells still count)."""
        s = self.sessions.setdefault(sid, _Session())
        seqs = [(q, p0) for q, _, p0, _ in step.seqs] or [(0, step.pos[0])]
        for q, p0 in seqs:  # the step's batch starts q at p0: q's cells from p0 on are gone
            for key, writes in s.live.items():
                if key[0] != step.ctx:
                    continue
                for w in writes:
                    if w.seqs.get(q, p0 - 1) >= p0:
                        del w.seqs[q]
                if any(not w.seqs for w in writes):
                    s.live[key] = [w for w in writes if w.seqs]
        if not wanted:
            return [{} for _ in step.computes]
        out = []
        offset = 0
        for c in step.computes:
            if step.seqs:
                here = dict(seqs)
            else:
                here = {0: step.pos[0] + offset}
            offset += c.n_tokens
            out.append(self._compute(s, step.ctx, c, here))
        return out

    def _compute(self, s: _Session, ctx: int, c: Compute, seqs: dict[int, int]) -> OpFlows:
        if c.graph is None:
            return {}
        roles = self._roles(s, c.graph)
        # the compute's KV ops, by the graph's mask: the ops whose node has a KV role, and the
        # fused ones (their members may have one)
        node_of = c.op_node
        nodes = node_of.tolist()
        fused_of = c.op_fused
        positions = sorted(set(np.flatnonzero(roles.any[node_of]).tolist()) | set(fused_of))
        flows: OpFlows = {}
        for k in positions:
            members = [nodes[k], *fused_of.get(k, ())]
            starts: list[int] = []
            ends: list[int] = []
            for i in members:
                for cache in roles.reads[i]:
                    for w in s.live.get((ctx, cache), ()):
                        if w.seqs.keys() & seqs.keys():
                            self._read(w, ends)
                for cache in roles.writes[i]:
                    w = _Write(self.n_writes, dict(seqs))
                    self.n_writes += 1
                    s.live.setdefault((ctx, cache), []).append(w)
                    if self.counting:
                        self.counts.append(0)
                    else:
                        n = self.counts[w.index]
                        starts.extend(range(self.base[w.index] + 1, self.base[w.index] + n + 1))
            if starts or ends:
                flows[k] = (tuple(starts), tuple(ends))
        return flows

    def _read(self, w: _Write, ends: list[int]) -> None:
        if self.counting:
            self.counts[w.index] += 1
        else:
            ends.append(self.base[w.index] + w.readers + 1)
        w.readers += 1


def count(events: Iterable[Event], layer: int | None, wants: Callable[[Step], bool]) -> KvFlows:
    """The writing walk's ``KvFlows``, after a counting walk over ``events`` (the same events the
    trace is made from, with the same choice of layer and steps)."""
    counter = KvFlows(layer)
    for ev in events:
        if isinstance(ev, StepDone):
            counter.step(ev.session.sid, ev.step, wants(ev.step))
    return KvFlows(layer, counter.counts)
