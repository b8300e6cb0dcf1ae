"""The session model: one model of a run, which every writer renders.

Two ways to consume a log:

* ``iter_events(path)`` streams: it yields ``SessionStarted``, then ``StepDone`` for each decode step
  as soon as its ``step_end`` (or the end of the file) is read, then ``SessionEnded``. Only the
  steps in flight and the graph tables are held in memory, so a writer that streams its output
  stays bounded whatever the log's size.
* ``load(path)`` materializes every session with all its steps (analysis, tests, small logs).

Several sessions may share a file; they are told apart by ``sid``. A session with no
``session_end`` (the process died) is closed at the last timestamp seen, and so are its open
steps; both are marked ``ended=False``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .errors import UserError
from .reader import ReadReport, iter_records


@dataclass
class Node:
    """One node of a compute graph, as the graph table describes it."""

    i: int
    name: str
    op: str
    sub: str | None
    layer: int | None
    shape: list[int]
    dtype: str
    bytes: int
    src: list[dict[str, Any]]
    flags: list[str]

    @property
    def label(self) -> str:
        """What a person calls this op: ``MUL_MAT``, or ``GLU:SWIGLU`` / ``UNARY:SILU``."""
        return f"{self.op}:{self.sub}" if self.sub else self.op


@dataclass
class Graph:
    ctx: int
    id: int
    n_tokens: int
    nodes: list[Node]


@dataclass
class OpTiming:
    """One executed op of one compute: absolute start (ns) and duration."""

    node: Node
    start: int
    dur: int
    fused: list[Node] = field(default_factory=list)
    thread_done: list[int] | None = None  # ns from start until each worker thread finished
    stats: tuple[Any, ...] | None = None  # (min, max, mean, std, n_nan, n_inf), verbose


class LayerSpan(NamedTuple):
    """A layer's part of a compute: first start to last end of its timed ops (a tuple: a million
    ops come with some 50,000 of these)."""

    layer: int
    start: int
    dur: int
    n_ops: int


@dataclass
class Compute:
    step: int
    ubatch: int
    graph: Graph | None
    start: int
    dur: int
    n_tokens: int
    n_threads: int
    status: int
    layers: list[LayerSpan]
    ops: list[OpTiming]


@dataclass
class Step:
    index: int
    ctx: int
    kind: str  # "prompt" or "gen"
    n_tokens: int
    pos: tuple[int, int]
    start: int
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    request: str | None = None  # the request it served (instr serve)
    seqs: list[tuple[int, int, int, int]] = field(default_factory=list)  # seq, n_tokens, pos0, pos1
    dur: int = 0
    status: int | None = None
    n_outputs: int = 0
    kv_used: int = -1
    computes: list[Compute] = field(default_factory=list)
    topk: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False

    @property
    def end(self) -> int:
        return self.start + self.dur

    @property
    def op_time(self) -> int:
        return sum(op.dur for c in self.computes for op in c.ops)


@dataclass
class SessionInfo:
    """Everything session_start says, plus what the end says once known."""

    sid: str
    start_ts: int
    wall_time: str
    level: str
    schema_version: int
    producer: dict[str, Any]
    metadata: dict[str, Any]
    model: dict[str, Any]
    context: dict[str, Any]
    weights: list[dict[str, Any]]
    memory: dict[str, Any]
    end: dict[str, Any] | None = None
    last_ts: int = 0
    # `request` records (instr serve), in log order
    requests: list[dict[str, Any]] = field(default_factory=list)
    # the machine that made the log (CPU model, devices), {} in logs from before it was recorded
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.end is not None

    @property
    def title(self) -> str:
        name = str(self.model.get("name") or self.model.get("architecture") or "model")
        ftype = str(self.model.get("file_type", ""))
        return f"{name} {ftype} [{self.sid}]".replace("  ", " ")


@dataclass
class SessionStarted:
    session: SessionInfo


@dataclass
class StepDone:
    session: SessionInfo
    step: Step


@dataclass
class SessionEnded:
    session: SessionInfo


Event = SessionStarted | StepDone | SessionEnded


def layer_rows(raw: Any, t0: int) -> np.ndarray | None:
    """A compute record's ``layers`` rows as an int64 array, start offsets made absolute, in bulk;
    None unless they are all four plain ints with non-negative times (the per-row reading then
    converts or rejects the odd values)."""
    if type(raw) is not list or not raw:
        return None
    try:
        flat = list(chain.from_iterable(raw))
        if len(flat) != 4 * len(raw) or set(map(len, raw)) != {4}:
            return None
        a = np.frombuffer(array("q", flat), np.int64).reshape(-1, 4).copy()  # ints only
        lo, hi = a.min(axis=0), a.max(axis=0)
        if lo[1] < 0 or lo[2] < 0 or t0 + int(hi[1]) >= 1 << 63:
            return None
        a[:, 1] += t0
        return a
    except (TypeError, ValueError, OverflowError):
        return None


def _layers(raw: Any, t0: int) -> list[LayerSpan]:
    """A compute record's ``layers`` rows, their start offsets made absolute. ``raw`` may be
    ``layer_rows(raw, t0)`` already (the forked log reader's work: ``prefetch``)."""
    a = raw if isinstance(raw, np.ndarray) else layer_rows(raw, t0)
    if a is not None:
        return list(map(LayerSpan._make, a.tolist()))
    return [LayerSpan(int(a), t0 + _nn(b), _nn(c), int(d)) for a, b, c, d in raw]


def _nn(v: Any) -> int:
    """A non-negative integer (timestamps, offsets, durations), else ValueError."""
    x = int(v)
    if x < 0:
        raise ValueError(f"negative time value {x}")
    return x


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _info(rec: dict[str, Any]) -> SessionInfo:
    memory = _dict(rec.get("memory"))
    return SessionInfo(
        sid=str(rec["sid"]),
        start_ts=_nn(rec["ts"]),
        wall_time=str(rec.get("wall_time", "")),
        level=str(rec.get("level", "")),
        schema_version=int(rec.get("schema_version", 1)),
        producer=_dict(rec.get("producer")),
        metadata=_dict(rec.get("metadata")),
        model=_dict(rec.get("model")),
        context=_dict(rec.get("context")),
        weights=[w for w in rec.get("weights", []) if isinstance(w, dict)],
        # totals must be numbers; per-buffer rows are kept as given
        memory={k: (int(v) if k != "buffers" else v) for k, v in memory.items()},
        last_ts=_nn(rec["ts"]),
        machine=_dict(rec.get("machine")),
    )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _graph(rec: dict[str, Any]) -> Graph:
    nodes = [
        Node(
            i=int(n["i"]),
            name=str(n["name"]),
            op=str(n["op"]),
            sub=None if n.get("sub") is None else str(n["sub"]),
            layer=_opt_int(n.get("layer")),
            shape=[int(d) for d in n["shape"]],
            dtype=str(n["dtype"]),
            bytes=int(n["bytes"]),
            src=[x for x in n.get("src", []) if isinstance(x, dict)],
            flags=[str(f) for f in n.get("flags", [])],
        )
        for n in rec["nodes"]
    ]
    # sources must point at nodes of this graph, or describe a tensor
    for node in nodes:
        for x in node.src:
            if "node" in x and not 0 <= int(x["node"]) < len(nodes):
                raise ValueError(f"node {node.i} has a source outside the graph")
    return Graph(
        ctx=int(rec["ctx"]), id=int(rec["graph"]), n_tokens=int(rec["n_tokens"]), nodes=nodes
    )


class _SessionState:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.graphs: dict[tuple[int, int], Graph] = {}
        self.open_steps: dict[tuple[int, int], Step] = {}  # (ctx, step) -> step in flight


def _compute(rec: dict[str, Any], graph: Graph | None) -> Compute:
    t0 = _nn(rec["t_start"])
    ops: list[OpTiming] = []
    threads = rec.get("threads")
    for k, entry in enumerate(rec.get("ops", [])):
        i, off, dur = int(entry[0]), _nn(entry[1]), _nn(entry[2])
        if graph is None or not 0 <= i < len(graph.nodes):
            continue
        fused = (
            [graph.nodes[int(j)] for j in entry[3] if 0 <= int(j) < len(graph.nodes)]
            if len(entry) > 3
            else []
        )
        ops.append(
            OpTiming(
                node=graph.nodes[i],
                start=t0 + off,
                dur=dur,
                fused=fused,
                thread_done=[int(x) for x in threads[k]] if threads and k < len(threads) else None,
            )
        )
    layers = _layers(rec["layers"], t0)
    return Compute(
        step=rec["step"],
        ubatch=rec["ubatch"],
        graph=graph,
        start=t0,
        dur=_nn(rec["dur"]),
        n_tokens=int(rec["n_tokens"]),
        n_threads=int(rec.get("n_threads", 0)),
        status=int(rec.get("status", 0)),
        layers=layers,
        ops=ops,
    )


def _attach_stats(compute: Compute, rec: dict[str, Any]) -> None:
    by_node = {row[0]: tuple(row[1:]) for row in rec["stats"]}
    for op in compute.ops:
        if op.node.i in by_node:
            op.stats = by_node[op.node.i]


# what applying a record that parses but does not have the schema's shape raises
MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def skip_malformed(
    path: Path | str, n: int, rec: dict[str, Any], exc: Exception, strict: bool, rep: ReadReport
) -> None:
    """Line ``n`` held such a record: an error with ``strict``, else skipped like bad JSON."""
    why = f"malformed {rec.get('type')} record ({type(exc).__name__}: {exc})"
    if strict:
        raise UserError(f"{path}: line {n}: {why}") from None
    rep.skipped.append((n, why))


def iter_events(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> Iterator[Event]:
    """Stream the sessions of a log as events (see the module docstring)."""
    rep = report if report is not None else ReadReport()
    states: dict[str, _SessionState] = {}
    for n, rec in iter_records(path, strict=strict, report=rep):
        try:
            yield from _apply(rec, states)
        except MALFORMED as exc:
            skip_malformed(path, n, rec, exc, strict, rep)
    for state in states.values():  # sessions the file ends in the middle of
        yield from _close(state, state.info.last_ts)
        yield SessionEnded(state.info)


def _request_id(rec: dict[str, Any]) -> str | None:
    r = rec.get("request")
    return str(r) if r is not None else None


def _seqs(rec: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """step_begin.seqs: [seq, n_tokens, first pos, last pos] per sequence (well-formed rows)."""
    out = []
    for row in rec.get("seqs") or []:
        if isinstance(row, list) and len(row) == 4:
            out.append((int(row[0]), int(row[1]), int(row[2]), int(row[3])))
    return out


def _topk_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A topk record's well-formed rows."""
    return [
        r
        for r in rec["rows"]
        if isinstance(r, dict)
        and isinstance(r.get("ids"), list)
        and isinstance(r.get("logits"), list)
        and r["ids"]
        and r["logits"]
    ]


def _end_step(step: Any, rec: dict[str, Any]) -> None:
    """What a step_end record says of its step (a ``Step``, or the bulk reader's own kind)."""
    step.start = _nn(rec["t_start"])
    step.dur = _nn(rec["dur"])
    step.status = int(rec["status"])
    step.n_outputs = int(rec["n_outputs"])
    step.kv_used = int(rec["kv_used"])
    step.ended = True


def _apply(rec: dict[str, Any], states: dict[str, _SessionState]) -> Iterator[Event]:
    """Fold one record into the per-session state; yield the events it completes."""
    rtype = rec["type"]
    sid = str(rec["sid"])
    if rtype == "session_start":
        st = _SessionState(_info(rec))
        states[sid] = st
        yield SessionStarted(st.info)
        return
    state = states.get(sid)
    if state is None:
        return  # a fragment of a session whose start was lost: nothing to anchor it to
    state.info.last_ts = max(state.info.last_ts, _nn(rec["ts"]))
    if rtype == "graph":
        g = _graph(rec)
        state.graphs[(g.ctx, g.id)] = g
    elif rtype == "step_begin":
        key = (int(rec["ctx"]), int(rec["step"]))
        state.open_steps[key] = Step(
            index=int(rec["step"]),
            ctx=int(rec["ctx"]),
            kind="gen" if rec["kind"] == "gen" else "prompt",
            n_tokens=int(rec["n_tokens"]),
            pos=(int(rec["pos"][0]), int(rec["pos"][1])),
            start=_nn(rec["ts"]),
            tokens=[int(t) for t in rec.get("tokens", [])],
            pieces=[str(x) for x in rec.get("pieces", [])],
            request=_request_id(rec),
            seqs=_seqs(rec),
        )
    elif rtype == "request":
        state.info.requests.append(rec)
    elif rtype == "compute":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            graph = state.graphs.get((int(rec["ctx"]), int(rec["graph"])))
            step.computes.append(_compute(rec, graph))
    elif rtype == "tensor_stats":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            for c in step.computes:
                if c.ubatch == int(rec["ubatch"]):
                    _attach_stats(c, rec)
    elif rtype == "topk":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            step.topk = _topk_rows(rec)
    elif rtype == "step_end":
        step = state.open_steps.pop((int(rec["ctx"]), int(rec["step"])), None)
        if step is not None:
            _end_step(step, rec)
            yield StepDone(state.info, step)
    elif rtype == "session_end":
        yield from _close(state, rec["ts"])
        state.info.end = rec
        del states[sid]
        yield SessionEnded(state.info)


def _close(state: _SessionState, ts: int) -> Iterator[StepDone]:
    """Steps that never ended: closed at ``ts``, marked not ended."""
    for step in state.open_steps.values():
        last = max([step.start] + [c.start + c.dur for c in step.computes])
        step.dur = max(ts, last) - step.start
        step.ended = False
        yield StepDone(state.info, step)
    state.open_steps.clear()


@dataclass
class Session:
    info: SessionInfo
    steps: list[Step]

    @property
    def graphs(self) -> dict[int, Graph]:
        out: dict[int, Graph] = {}
        for s in self.steps:
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
    return [sessions[s] for s in order]
