"""The session model: the records of a log folded into sessions and steps, for every writer.

Ways to consume a log:

* ``iter_events(path)`` streams: it yields ``SessionStarted``, then each pass's own event as soon
  as its ``step_end`` (or the end of the file) is read (``StepDone`` for a decode step,
  ``EncodeDone`` for an encoder's encode: ``PASS_EVENTS``), and ``HostDone`` for each ``host``
  record (the host's work after a step), then ``SessionEnded``. Only the
  steps in flight and the graph tables are held in memory, so a writer that streams its output
  stays bounded whatever the log's size. Every compute's ops are columns (``reading.decode.computes.Compute``).
* ``iter_events_packed(path)`` is the same fold, the ops of well-formed compute records read in
  bulk (``decode_compute_bulk``) instead of op by op, and big logs read on the other core
  (``reading.prefetch``): what the trace writers, the tables and ``kv_flows`` read. The two give the
  same steps (the per-op decoding is the reference the bulk one is tested against).
* ``Fold`` is the fold itself, fed one record at a time (``analysis.follow``).
* ``load(path)`` materializes every session with all its steps (analysis, tests, small logs).

Several sessions may share a file; they are told apart by ``sid``. A session with no
``session_end`` (the process died) is closed at the last timestamp seen, and so are its open
steps; both are marked ``ended=False``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..reading import prefetch
from ..reading.decode.columns import PackedOps
from ..reading.decode.computes import (
    attach_stats,
    decode_compute,
    decode_compute_bulk,
)
from ..reading.decode.fields import MALFORMED, nonneg, skip_malformed
from ..reading.decode.graphs import Graph, Tables, graph_record
from ..reading.decode.host import chain_record, host_record, perf_record
from ..reading.decode.media import Encode, encode_begun, is_encode, medium_record
from ..reading.decode.memory import allocation, failure
from ..reading.decode.passes import Pass, end_step
from ..reading.decode.sessions import (
    EncodeDone,
    Event,
    HostDone,
    SessionEnded,
    SessionInfo,
    SessionStarted,
    StepDone,
    part_record,
    request_record,
    session_info,
)
from ..reading.decode.spec import MAX_CONTEXTS, context_record, spec_record
from ..reading.decode.steps import Step, step_begun, topk_rows
from ..reading.decode.transfers import transfers
from ..reading.reader import ReadReport, iter_records
from .device_time import multi_device
from .expert_routing import ROUTING_CELLS, Router, Routing, routers, routing

__all__ = ["Fold", "Session", "iter_events", "iter_events_packed", "load"]


# graphs whose routers a session keeps worked out (a few per context: each shape of batch)
ROUTER_GRAPHS = 64
# each kind of pass, the event that hands it out when it ends
PASS_EVENTS: dict[type[Pass], Callable[[SessionInfo, Any], Event]] = {
    Step: StepDone,
    Encode: EncodeDone,
}


class _SessionState:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        # where its computes ran is read only when its machine has several devices
        self.devices = multi_device(info)
        self.graphs: dict[tuple[int, int], Graph] = {}
        # the node tables written out (whole, or by ``subst``), which a later graph may name
        # (``same_as``): kept apart from ``graphs``, which a long follow trims
        self.tables: dict[tuple[int, int], Graph] = Tables()
        self.open_steps: dict[tuple[int, int], Pass] = {}  # (ctx, step) -> pass in flight
        self.routers: dict[Graph, dict[int, Router]] = {}  # a MoE's graphs' routers, by graph
        self.routed_layers: set[int] = set()  # the layers its routing records name
        self.routed_experts = 0  # their most experts

    def routing(self, rec: dict[str, Any], step: Pass) -> Routing:
        """An ``experts`` record of ``step``, bounded by its compute's graph: one per compute, of
        a compute the step holds (``expert_routing.routing`` says the rest)."""
        ubatch = rec["ubatch"]
        c = next((c for c in step.computes if c.ubatch == ubatch), None)
        if c is None or any(r.ubatch == ubatch for r in step.experts):
            raise ValueError(f"an experts record of ubatch {ubatch!r}: no compute, or a second")
        g = c.graph
        by_layer: dict[int, Router] = {}
        if g is not None:
            if g not in self.routers:
                if len(self.routers) >= ROUTER_GRAPHS:
                    self.routers.clear()
                self.routers[g] = routers(g)
            by_layer = self.routers[g]
        context = self.info.contexts.get(step.ctx)
        n_layer = context["model"].get("n_layer") if context is not None else None
        r = routing(rec, g, by_layer, n_layer)
        layers = self.routed_layers.union(np.unique(r.rows[:, 0]).tolist())
        n_expert = max(self.routed_experts, r.n_expert)
        if len(layers) * n_expert > ROUTING_CELLS:
            raise ValueError(f"routing of {len(layers)} layers of {n_expert} experts in a session")
        self.routed_layers, self.routed_experts = layers, n_expert
        return r


def iter_events(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> Iterator[Event]:
    """Stream the sessions of a log as events (see the module docstring), every compute record
    decoded op by op."""
    return _fold(path, iter_records, strict, report, packed=False)


def iter_events_packed(
    path: Path | str,
    *,
    strict: bool = False,
    report: ReadReport | None = None,
    fork: bool = True,
    fork_from: int | None = None,
) -> Iterator[Event]:
    """``iter_events``, the ops of well-formed computes read in bulk, and a big log (``fork_from``
    bytes or more; None: ``prefetch.MIN_BYTES``) read on the other core (``prefetch``;
    ``fork=False``: here): the same steps, the same skipped records."""
    read = partial(prefetch.records, min_bytes=fork_from) if fork else iter_records
    return _fold(path, read, strict, report, packed=True)


def _fold(
    path: Path | str,
    read: Callable[..., Iterator[tuple[int, dict[str, Any]]]],
    strict: bool,
    report: ReadReport | None,
    packed: bool,
) -> Iterator[Event]:
    """A log's records through one ``Fold``, damaged ones skipped (or an error with ``strict``)."""
    rep = report if report is not None else ReadReport()
    fold = Fold(packed=packed)
    for n, rec in read(path, strict=strict, report=rep):
        try:
            yield from fold.add(rec)
        except MALFORMED as exc:
            skip_malformed(path, n, rec, exc, strict, rep)
    yield from fold.close()


class Fold:
    """The one fold of records into events, a record at a time: what ``iter_events`` runs over a
    file, and what ``follow`` feeds with the lines another process is writing.

    ``add`` applies one record and yields the events it completes (raising one of
    ``decode.fields.MALFORMED`` for a record without the schema's shape); ``close`` ends the input,
    closing the sessions still open. ``packed`` reads well-formed computes' ops in bulk, the
    rest going to the per-op decoder as read. ``keep_graphs``: hold at most that many graph
    tables per session, the oldest dropped first (a live view's memory must not grow with the
    run; a compute of a dropped graph has no ops).
    """

    def __init__(self, *, packed: bool = True, keep_graphs: int | None = None) -> None:
        self.packed = packed
        self.keep_graphs = keep_graphs
        self.states: dict[str, _SessionState] = {}
        self.fused_of: dict[Graph, dict[int, list[int]]] = {}  # (``decode_compute_bulk``)

    def add(self, rec: dict[str, Any]) -> Iterator[Event]:
        states = self.states
        if self.packed and rec["type"] == "compute":
            if self._add_compute_bulk(rec):
                return
            if isinstance(rec.get("ops"), PackedOps):
                rec["ops"] = rec["ops"].to_list()  # as read, for the per-op decoder
        if self.keep_graphs is not None and rec["type"] == "graph":
            state = states.get(str(rec["sid"]))
            if state is not None and len(state.graphs) > self.keep_graphs:
                dropped = state.graphs.pop(next(iter(state.graphs)))
                self.fused_of.pop(dropped, None)
        yield from _apply(rec, states)

    def _add_compute_bulk(self, rec: dict[str, Any]) -> bool:
        """Apply a compute record as ``_apply`` does, its ops read in bulk; False (nothing done)
        when it is not a compute of an open step and a known graph, or its ops are unusual: the
        per-op decoder then reads it."""
        try:
            state = self.states.get(str(rec["sid"]))
            if state is None:
                return False
            step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
            graph = state.graphs.get((int(rec["ctx"]), int(rec["graph"])))
        except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
            return False
        if step is None or graph is None:
            return False
        state.info.last_ts = max(state.info.last_ts, nonneg(rec["ts"]))  # as ``_apply`` first
        c = decode_compute_bulk(rec, graph, self.fused_of, state.devices)
        if c is None:
            return False
        step.computes.append(c)
        return True

    def close(self) -> Iterator[Event]:
        """The sessions the input ends in the middle of: their open steps, then their end."""
        for state in self.states.values():
            yield from _close(state, state.info.last_ts)
            yield SessionEnded(state.info)
        self.states.clear()

    def open_steps(self) -> int:
        """Steps begun and not yet ended, over all sessions."""
        return sum(len(s.open_steps) for s in self.states.values())


def _apply(rec: dict[str, Any], states: dict[str, _SessionState]) -> Iterator[Event]:
    """Fold one record into the per-session state; yield the events it completes."""
    rtype = rec["type"]
    sid = str(rec["sid"])
    if rtype == "session_start":
        started = _start(rec, states, sid)
        if started is not None:
            yield started
        return
    state = states.get(sid)
    if state is None:
        return  # a fragment of a session whose start was lost: nothing to anchor it to
    info = state.info
    info.last_ts = max(info.last_ts, nonneg(rec["ts"]))
    if rtype == "graph":
        g = graph_record(rec, state.tables)
        state.graphs[(g.ctx, g.id)] = g
    elif rtype == "step_begin":
        _step_begin(state, rec)
    elif rtype == "request":
        info.requests.append(request_record(rec))
    elif rtype == "part":
        info.parts.append(part_record(rec))
    elif rtype == "context":
        _context(info, rec)
    elif rtype == "media":
        info.media.add(medium_record(rec))
    elif rtype == "spec":
        info.verifies.append(spec_record(rec))
    elif rtype == "host":
        yield HostDone(info, host_record(rec))
    elif rtype == "chain":
        info.chains.append(chain_record(rec))
    elif rtype == "perf":
        info.perf.append(perf_record(rec))
    elif rtype == "transfers":
        _transfers(state, rec)
    elif rtype == "memory_alloc":
        a = allocation(rec)
        # each file of a rotated log begins with the live buffers again: known ids are kept
        info.allocations.setdefault(a.id, a)
    elif rtype == "memory_free":
        buf = info.allocations.get(nonneg(rec["id"]))
        if buf is not None and buf.freed is None:
            buf.freed = nonneg(rec["ts"])
    elif rtype == "memory_alloc_failed":
        info.memory_failures.append(failure(rec))
    elif rtype == "compute":
        _compute(state, rec)
    elif rtype == "tensor_stats":
        _tensor_stats(state, rec)
    elif rtype == "experts":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            step.experts.append(state.routing(rec, step))
    elif rtype == "topk":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if isinstance(step, Step):  # (a decode step's outputs)
            step.topk = topk_rows(rec)
    elif rtype == "step_end":
        step = state.open_steps.pop((int(rec["ctx"]), int(rec["step"])), None)
        if step is not None:
            end_step(step, rec)
            yield PASS_EVENTS[type(step)](info, step)
    elif rtype == "session_end":
        yield from _close(state, rec["ts"])
        info.end = rec
        del states[sid]
        yield SessionEnded(info)


def _start(
    rec: dict[str, Any], states: dict[str, _SessionState], sid: str
) -> SessionStarted | None:
    """A session begun; None for the next file of a rotated log, where the same session goes on
    (its graph tables follow)."""
    known = states.get(sid)
    if known is not None and isinstance(rec.get("file"), dict):
        known.info.files += 1
        known.info.last_ts = max(known.info.last_ts, nonneg(rec["ts"]))
        return None
    st = _SessionState(session_info(rec))
    states[sid] = st
    return SessionStarted(st.info)


def _step_begin(state: _SessionState, rec: dict[str, Any]) -> None:
    """A pass begun, of its kind (an encoder's encode, else a decode step): open until its
    ``step_end``."""
    key = (int(rec["ctx"]), int(rec["step"]))
    begin = encode_begun if is_encode(rec) else step_begun
    state.open_steps[key] = begin(rec, state.info.level)


def _transfers(state: _SessionState, rec: dict[str, Any]) -> None:
    """RPC commands: its step's (a phase step, while open), else the session's."""
    t = transfers(rec)
    step = None
    if t.ctx is not None and t.step is not None:  # (phase step)
        step = state.open_steps.get((t.ctx, t.step))
    (step.transfers if step is not None else state.info.transfers).append(t)


def _context(info: SessionInfo, rec: dict[str, Any]) -> None:
    """A context made: kept, up to ``MAX_CONTEXTS`` (one known is kept up to date)."""
    context = context_record(rec)
    if len(info.contexts) < MAX_CONTEXTS or context["ctx"] in info.contexts:
        info.contexts[context["ctx"]] = context


def _compute(state: _SessionState, rec: dict[str, Any]) -> None:
    """A compute of an open step, decoded op by op (``Fold`` reads most in bulk instead)."""
    step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
    if step is not None:
        graph = state.graphs.get((int(rec["ctx"]), int(rec["graph"])))
        step.computes.append(decode_compute(rec, graph, state.devices))


def _tensor_stats(state: _SessionState, rec: dict[str, Any]) -> None:
    """The statistics of a compute's tensors, onto the open step's compute of that ubatch."""
    step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
    if step is not None:
        for c in step.computes:
            if c.ubatch == int(rec["ubatch"]):
                attach_stats(c, rec)


def _close(state: _SessionState, ts: int) -> Iterator[Event]:
    """Passes that never ended: closed at ``ts``, marked not ended."""
    for step in state.open_steps.values():
        last = max([step.start] + [c.start + c.dur for c in step.computes])
        step.dur = max(ts, last) - step.start
        step.ended = False
        yield PASS_EVENTS[type(step)](state.info, step)
    state.open_steps.clear()


@dataclass
class Session:
    info: SessionInfo
    steps: list[Step]  # its decode steps
    encodes: list[Encode] = field(default_factory=list)  # its encoders' encodes

    @property
    def graphs(self) -> dict[int, Graph]:
        out: dict[int, Graph] = {}
        for s in [*self.steps, *self.encodes]:
            for c in s.computes:
                if c.graph is not None:
                    out[c.graph.id] = c.graph
        return out


def load(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> list[Session]:
    """Every session of the log, fully materialized, in the order they started."""
    sessions: dict[str, Session] = {}
    order: list[str] = []
    for ev in iter_events(path, strict=strict, report=report):
        if isinstance(ev, SessionStarted):
            sessions[ev.session.sid] = Session(ev.session, [])
            order.append(ev.session.sid)
        elif isinstance(ev, StepDone):
            sessions[ev.session.sid].steps.append(ev.step)
        elif isinstance(ev, EncodeDone):
            sessions[ev.session.sid].encodes.append(ev.encode)
    return [sessions[s] for s in order]
