"""The record decoder: what each record of a session log says, as typed objects and columns.

Every reader of logs goes through here (``session.iter_events`` folds these into steps; the
trace writers, the tables of ``frames``, ``follow``, ``compare``, ``kv_flows`` read those):

* record types: ``Node`` and ``Graph`` (graph tables), ``SessionInfo`` (session_start),
  ``Step``, ``Compute`` (its ops always columns), ``LayerSpan``;
* one decoder per record kind (``session_info``, ``graph_table``, ``decode_compute`` and, its
  ops in bulk, ``decode_compute_bulk``, ``step_seqs``, ``topk_rows``, ``end_step``,
  ``attach_stats``), each raising one of ``MALFORMED`` on a record that parses but lacks the
  schema's shape;
* the one packer of a compute's ``ops`` and ``layers`` lists into int64 columns (``pack_ops``,
  ``layer_rows``), which the forked reader (``prefetch``) runs on the other core;
* ``Compute.unpack``/``op_at``, the lazy per-op view (``OpTiming``) for the few places that want
  objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple, overload

import numpy as np

from .errors import UserError
from .reader import ReadReport

_ITEM = (itemgetter(0), itemgetter(1), itemgetter(2))

# --- record types ---------------------------------------------------------------------------


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


@dataclass(eq=False)
class Graph:
    """A compute graph's node table (a ``graph`` record). Equal only to itself, and hashable: what
    is worked out once per graph (its layers, its ops' static args...) is kept in dicts keyed by
    the graph."""

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


class Split(NamedTuple):
    """What ggml's scheduler ran on one device (a ``splits`` row): the device (an index into
    ``session_start.machine.devices``), its graph nodes ``[i_start, i_end)``, and host times
    (absolute ns): when the split began (its input copies first), when its graph was handed to the
    backend, and when the backend returned it."""

    device: int
    i_start: int
    i_end: int
    start: int
    launch: int
    end: int


class Copy(NamedTuple):
    """A tensor the scheduler copied to another device for a split (a ``copies`` row): the split
    (an index into the compute's splits), its node (-1: a weight or input) and name, bytes, the
    source and destination devices, and the host-side time of the copy call (absolute ns)."""

    split: int
    node: int
    name: str
    bytes: int
    src: int
    dst: int
    start: int
    dur: int


class Busy(NamedTuple):
    """A stretch of work a device timed itself (a ``busy`` row; Vulkan: a command buffer, from its
    first command's start to its last's end): the device, absolute start, duration, the split
    whose ops it ran (-1: none, only copies) and how many ops."""

    device: int
    start: int
    dur: int
    split: int
    n_ops: int


class Remote(NamedTuple):
    """A graph a patched RPC server computed and timed itself (a ``remote`` row), placed on this
    log's clock: the split (-1: none matched), the device, the client's send and reply times, the
    server's compute start and end (absolute ns), the one-way network estimate and the placement's
    uncertainty (ns), the server's clock offset, the graph command's bytes and its ops."""

    split: int
    device: int
    send: int
    reply: int
    start: int
    end: int
    one_way: int
    err: int
    clock_offset: int
    bytes: int
    n_ops: int


class Clock(NamedTuple):
    """How a device's own timestamps were put on the host clock (a ``clocks`` row)."""

    device: int
    method: str
    uncertainty: int


@dataclass(eq=False)
class Placement:
    """Where a compute ran, beyond the CPU backend's ops: the scheduler's splits and copies, the
    stretches a device timed itself (``busy``, ``clocks``), the graphs remote servers timed
    (``remote``), and ``wait`` (ns from the last split's return until the backends were
    synchronized; None when the record does not say). Times absolute, in the compute's order."""

    splits: list[Split] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    busy: list[Busy] = field(default_factory=list)
    remote: list[Remote] = field(default_factory=list)
    clocks: list[Clock] = field(default_factory=list)
    wait: int | None = None


class TransferRow(NamedTuple):
    """One command a client sent to an RPC server (a ``transfers`` row), times absolute: the device
    (-1: not in ggml's registry yet), the command, the tensor it moves (``""``: none), its tensor
    bytes, the bytes written and read, and when it was issued, began to be written, was written
    whole, and its reply was read whole (``sent_at`` for a command without a reply)."""

    device: int
    cmd: str
    tensor: str
    bytes: int
    sent: int
    recv: int
    queue: int
    start: int
    sent_at: int
    end: int


@dataclass
class Transfers:
    """A ``transfers`` record: its phase (``load``, ``step``, ``between``), the step for phase
    ``step``, the commands not recorded, and its rows."""

    phase: str
    ctx: int | None
    step: int | None
    dropped: int
    rows: list[TransferRow]


_NO_OPS = np.zeros(0, np.int64)
_NO_OPS.flags.writeable = False


@dataclass(eq=False)
class Compute:
    """One compute (ubatch) of a step. Its timed ops are columns, in log order: ``op_node`` (the
    graph node position of each), ``op_start`` (absolute, ns), ``op_dur`` (ns), int64 arrays
    (object arrays of Python ints in the rare record with a value beyond 64 bits), with
    ``op_fused`` (op position -> fused node positions), and from verbose logs ``op_threads`` (per
    op, ns from its start until each worker thread finished, or None) and ``op_stats`` (op
    position -> tensor statistics). ``unpack``/``op_at``/``ops`` are the lazy per-op view for
    the few places that want ``OpTiming`` objects. The columns and ``op_fused`` are read-only:
    computes of the same graph may share them."""

    step: int
    ubatch: int | None  # (None in a log that did not say)
    graph: Graph | None
    start: int
    dur: int
    n_tokens: int
    n_threads: int
    status: int
    layers: Sequence[LayerSpan]  # a ``LayerRows`` when the rows were well-formed
    op_node: Any = field(default_factory=lambda: _NO_OPS)
    op_start: Any = field(default_factory=lambda: _NO_OPS)
    op_dur: Any = field(default_factory=lambda: _NO_OPS)
    op_fused: dict[int, list[int]] = field(default_factory=dict)
    op_threads: list[list[int] | None] | None = None  # None: the record had no thread timings
    op_stats: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    # where it ran (splits, copies, device-timed stretches, remote graphs), if the record says
    place: Placement | None = None
    # per layer span, the device that timed it (-1: the CPU backend's); None: all the CPU backend's
    layer_device: Any = None

    @property
    def n_ops(self) -> int:
        return len(self.op_node)

    @property
    def per_op(self) -> bool:
        """Whether the bulk trace writers leave this compute's ops to the per-op view: thread
        timings or tensor statistics (verbose logs), or a value beyond 64 bits."""
        return (
            self.op_threads is not None
            or bool(self.op_stats)
            or self.op_start.dtype == object
            or self.op_dur.dtype == object
        )

    @property
    def op_time(self) -> int:
        """The sum of its ops' durations (ns), exact."""
        d = self.op_dur
        # durations are below 2**62 each: exact in int64 while the (float) total stays small
        if d.dtype != object and (len(d) < 2 or float(d.sum(dtype=np.float64)) < 2.0**62):
            return int(d.sum())
        return sum(d.tolist())

    def op_at(self, k: int) -> OpTiming:
        """The ``k``-th timed op alone."""
        assert self.graph is not None
        nodes = self.graph.nodes
        threads = self.op_threads
        return OpTiming(
            node=nodes[int(self.op_node[k])],
            start=int(self.op_start[k]),
            dur=int(self.op_dur[k]),
            fused=[nodes[j] for j in self.op_fused.get(k, ())],
            thread_done=threads[k] if threads is not None else None,
            stats=self.op_stats.get(k),
        )

    def unpack(self) -> list[OpTiming]:
        """Every timed op as an ``OpTiming``, in log order."""
        if not len(self.op_node):
            return []
        assert self.graph is not None
        nodes = self.graph.nodes
        fused, stats = self.op_fused, self.op_stats
        threads = self.op_threads
        return [
            OpTiming(
                node=nodes[i],
                start=s,
                dur=d,
                fused=[nodes[j] for j in fused.get(k, ())],
                thread_done=threads[k] if threads is not None else None,
                stats=stats.get(k),
            )
            for k, (i, s, d) in enumerate(
                zip(
                    self.op_node.tolist(), self.op_start.tolist(), self.op_dur.tolist(), strict=True
                )
            )
        ]

    @property
    def ops(self) -> list[OpTiming]:
        """``unpack()``, made anew on each read."""
        return self.unpack()


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
    level: str = ""  # the level it was recorded at (sampling: minimal or the session's)
    dur: int = 0
    status: int | None = None
    n_outputs: int = 0
    kv_used: int = -1
    computes: list[Compute] = field(default_factory=list)
    topk: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    # the commands sent to RPC servers during the step (``transfers`` records of phase ``step``)
    transfers: list[Transfers] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.dur

    @property
    def op_time(self) -> int:
        return sum(c.op_time for c in self.computes)


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
    # `part` records (llama-bench's tests), in log order
    parts: list[dict[str, Any]] = field(default_factory=list)
    # `transfers` records outside any step (the model's upload: ``load``; ``between``), in log
    # order (a step's own are its ``Step.transfers``)
    transfers: list[Transfers] = field(default_factory=list)
    # the machine that made the log (CPU model, devices), {} in logs from before it was recorded
    machine: dict[str, Any] = field(default_factory=dict)
    # always on: sampling ({"steps": N, "requests": M}, {} when every step is recorded at the
    # level), rotation ({"max_bytes", "keep"}); a rotated log read alone or from a later file
    # says which file of the session it starts at (0: the first), and how many files were read
    sample: dict[str, Any] = field(default_factory=dict)
    rotate: dict[str, Any] = field(default_factory=dict)
    first_file: int = 0
    files: int = 1

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


def op_time_by_label(c: Compute) -> dict[str, int]:
    """A compute's op time (ns) per op label (``Node.label``), labels in order of first op."""
    out: dict[str, int] = {}
    if c.graph is None:
        return out
    nodes = c.graph.nodes
    for i, dur in zip(c.op_node.tolist(), c.op_dur.tolist(), strict=True):
        label = nodes[i].label
        out[label] = out.get(label, 0) + dur
    return out


# --- decoders, one per record kind ---------------------------------------------------------


def layer_rows(raw: Any, t0: int) -> np.ndarray | None:
    """A compute record's ``layers`` rows as an int64 array, start offsets made absolute, in bulk;
    None unless they are all plain ints with non-negative times (the per-row reading then
    converts or rejects the odd values). Rows of four (spans timed on the CPU backend) give
    (m, 4); rows naming their device in a fifth element give (m, 5), the device -1 in the rows
    without one."""
    if type(raw) is not list or not raw:
        return None
    try:
        flat = list(chain.from_iterable(raw))
        widths = set(map(len, raw))
        if widths == {4} and len(flat) == 4 * len(raw):
            a = np.frombuffer(array("q", flat), np.int64).reshape(-1, 4).copy()  # ints only
        elif widths <= {4, 5} and all(type(r) is list for r in raw):
            rows = [r if len(r) == 5 else [*r, -1] for r in raw]
            if not all(type(v) is int for v in chain.from_iterable(rows)):
                return None
            if min(r[4] for r in raw if len(r) == 5) < 0:  # (a device index)
                return None
            a = np.array(rows, np.int64)
        else:
            return None
        lo, hi = a.min(axis=0), a.max(axis=0)
        if lo[1] < 0 or lo[2] < 0 or t0 + int(hi[1]) >= 1 << 63:
            return None
        a[:, 1] += t0
        return a
    except (TypeError, ValueError, OverflowError):
        return None


class LayerRows(Sequence[LayerSpan]):
    """A compute's layer spans kept as the (m, 4) int64 ``rows`` ``layer_rows`` made (layer,
    absolute start, dur, n_ops): the tables take the rows as they are, and the ``LayerSpan``
    tuples (a million ops come with some 50,000) are made only when first read."""

    __slots__ = ("rows", "_spans")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self._spans: list[LayerSpan] | None = None

    def spans(self) -> list[LayerSpan]:
        if self._spans is None:
            self._spans = list(map(LayerSpan._make, self.rows.tolist()))
        return self._spans

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, k: int) -> LayerSpan: ...
    @overload
    def __getitem__(self, k: slice) -> list[LayerSpan]: ...
    def __getitem__(self, k: int | slice) -> LayerSpan | list[LayerSpan]:
        return self.spans()[k]

    def __iter__(self) -> Iterator[LayerSpan]:
        return iter(self.spans())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self.spans() == list(other)

    def __repr__(self) -> str:
        return repr(self.spans())


def layer_spans(raw: Any, t0: int) -> tuple[Sequence[LayerSpan], Any]:
    """A compute record's ``layers`` rows, their start offsets made absolute, and the device of
    each span (an int64 array, -1 for the CPU backend's; None when no row names one). ``raw``
    may be ``layer_rows(raw, t0)`` already (the forked log reader's work: ``prefetch``)."""
    a = raw if isinstance(raw, np.ndarray) else layer_rows(raw, t0)
    if a is not None:
        if a.shape[1] == 4:
            return LayerRows(a), None
        return LayerRows(np.ascontiguousarray(a[:, :4])), a[:, 4].copy()
    if not any(type(r) is list and len(r) == 5 for r in raw):
        return [LayerSpan(int(a), t0 + nonneg(b), nonneg(c), int(d)) for a, b, c, d in raw], None
    spans, devices = [], []
    for a, b, c, d, *e in raw:
        if len(e) > 1:
            raise ValueError("a layers row of more than 5 elements")
        spans.append(LayerSpan(int(a), t0 + nonneg(b), nonneg(c), int(d)))
        devices.append(uint(e[0]) if e else -1)
    return spans, np.array(devices, np.int64)


def nonneg(v: Any) -> int:
    """A non-negative integer (timestamps, offsets, durations), else ValueError."""
    x = int(v)
    if x < 0:
        raise ValueError(f"negative time value {x}")
    return x


def uint(v: Any, lo: int = 0) -> int:
    """A JSON integer (not a bool, float or string) of at least ``lo``, else ValueError: the
    fields that name devices and places in a compute (read strictly: they index tables)."""
    if type(v) is not int or v < lo:
        raise ValueError(f"{v!r} is not an integer >= {lo}")
    return v


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def session_info(rec: dict[str, Any]) -> SessionInfo:
    memory = _dict(rec.get("memory"))
    return SessionInfo(
        sid=str(rec["sid"]),
        start_ts=nonneg(rec["ts"]),
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
        last_ts=nonneg(rec["ts"]),
        machine=_dict(rec.get("machine")),
        sample=_dict(rec.get("sample")),
        rotate=_dict(rec.get("rotate")),
        first_file=int(_dict(rec.get("file")).get("index", 0)),
    )


def step_level(rec: dict[str, Any], session_level: str) -> str:
    """The level a step_begin says it was recorded at; the session's in logs from before steps
    said it."""
    level = rec.get("level")
    return str(level) if isinstance(level, str) else session_level


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def graph_table(rec: dict[str, Any]) -> Graph:
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


def _column(values: list[int]) -> Any:
    """An int64 column; an object one for the rare value beyond 64 bits (kept as the log says)."""
    if not values:
        return _NO_OPS
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def decode_compute(rec: dict[str, Any], graph: Graph | None, devices: bool = True) -> Compute:
    """A compute record, op by op (``decode_compute_bulk`` reads the well-formed ones in bulk).
    ``devices``: read where it ran (``placement``); a session on one device does not need it."""
    t0 = nonneg(rec["t_start"])
    node: list[int] = []
    start: list[int] = []
    dur: list[int] = []
    fused: dict[int, list[int]] = {}
    threads: Any = rec.get("threads")
    done: list[list[int] | None] | None = [] if threads else None
    for k, entry in enumerate(rec.get("ops", [])):
        i, off, d = int(entry[0]), nonneg(entry[1]), nonneg(entry[2])
        if graph is None or not 0 <= i < len(graph.nodes):
            continue
        if len(entry) > 3:
            f = [int(j) for j in entry[3] if 0 <= int(j) < len(graph.nodes)]
            if f:
                fused[len(node)] = f
        if done is not None:
            done.append([int(x) for x in threads[k]] if k < len(threads) else None)
        node.append(i)
        start.append(t0 + off)
        dur.append(d)
    return _compute(
        rec, graph, t0, _column(node), _column(start), _column(dur), fused, done, devices
    )


def decode_compute_bulk(
    rec: dict[str, Any],
    graph: Graph,
    fused_of: dict[Graph, dict[int, list[int]]],
    devices: bool = True,
) -> Compute | None:
    """A compute record of ``graph`` its ops read in bulk (``pack_ops``): the ``Compute`` that
    ``decode_compute`` makes of it, or None when anything about its ops is unusual (thread
    timings, an odd entry, a node outside the graph, a time beyond 2**62), which
    ``decode_compute`` then reads op by op. ``fused_of``: per graph, the fused ops of its last
    compute, which every generation step repeats: reused, not rebuilt, and one dict for the
    graph's computes (the writers tell variants apart by it)."""
    cols = _bulk_columns(rec, graph, fused_of)
    if cols is None:
        return None
    node, start, dur, fused = cols
    return _compute(rec, graph, rec["t_start"], node, start, dur, fused, None, devices)


def _bulk_columns(
    rec: dict[str, Any], graph: Graph, fused_of: dict[Graph, dict[int, list[int]]]
) -> tuple[Any, Any, Any, dict[int, list[int]]] | None:
    """``(node, start, dur, fused)`` of a compute record whose ops ``decode_compute`` would keep
    all, with no thread timings; None when anything is unusual."""
    try:
        t0 = rec["t_start"]
        if rec.get("threads") or type(t0) is not int or not 0 <= t0 < 1 << 62:
            return None
        last = fused_of.get(graph)
        ops = rec.get("ops")
        packed = ops if isinstance(ops, PackedOps) else pack_ops(ops, last)
        if packed is None:
            return None
        lo, hi = packed.lo, packed.hi
        n_nodes = len(graph.nodes)
        if min(lo) < 0 or hi[0] >= n_nodes or t0 + hi[1] + hi[2] >= 1 << 62:
            return None
        if packed.f_lo < 0 or packed.f_hi >= n_nodes:
            return None
        fused = packed.fused
        if fused:
            if last is not None and (last is fused or last == fused):
                fused = last  # one dict for the graph's computes: the writers compare by id
            else:
                fused_of[graph] = fused
        node, off, dur = packed.arr
        return node, t0 + off, dur, fused
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None


def _compute(
    rec: dict[str, Any],
    graph: Graph | None,
    t0: int,
    node: Any,
    start: Any,
    dur: Any,
    fused: dict[int, list[int]],
    threads: list[list[int] | None] | None,
    devices: bool,
) -> Compute:
    """A compute record's ``Compute``, its ops already columns (where it ran: with ``devices``)."""
    layers, layer_device = layer_spans(rec["layers"], t0)
    return Compute(
        step=rec["step"],
        ubatch=_opt_int(rec["ubatch"]),
        graph=graph,
        start=t0,
        dur=nonneg(rec["dur"]),
        n_tokens=int(rec["n_tokens"]),
        n_threads=int(rec.get("n_threads", 0)),
        status=int(rec.get("status", 0)),
        layers=layers,
        op_node=node,
        op_start=start,
        op_dur=dur,
        op_fused=fused,
        op_threads=threads,
        place=placement(rec, t0) if devices else None,
        layer_device=layer_device,
    )


_PLACE_FIELDS = ("splits", "copies", "busy", "remote", "clocks", "wait")


def _rows(rec: dict[str, Any], key: str, width: int) -> list[list[Any]]:
    """A compute record's ``key`` rows, each a list of ``width`` values ([] when absent)."""
    raw = rec.get(key)
    if raw is None:
        return []
    if type(raw) is not list:
        raise TypeError(f"{key} is not a list")
    for row in raw:
        if type(row) is not list or len(row) != width:
            raise ValueError(f"a {key} row is not a list of {width} values")
    return raw


def _split_ref(v: Any, n_splits: int, none_ok: bool) -> int:
    """An index into the compute's splits (-1 where ``none_ok``)."""
    k = uint(v, -1 if none_ok else 0)
    if k >= n_splits:
        raise ValueError(f"split {k} of {n_splits}")
    return k


def _text(v: Any) -> str:
    if type(v) is not str:
        raise TypeError(f"{v!r} is not a string")
    return v


def placement(rec: dict[str, Any], t0: int) -> Placement | None:
    """Where a compute ran (``splits``, ``copies``, ``busy``, ``clocks``, ``remote``, ``wait``:
    see docs/schema.md), times made absolute; None for a record with none of them. Strict: a
    device, split or time that is not a plain integer in range raises ValueError or TypeError,
    and the record is skipped like any damaged one."""
    if not any(k in rec for k in _PLACE_FIELDS):
        return None
    p = Placement()
    for d, i0, i1, s, la, e in _rows(rec, "splits", 6):
        start, launch, end = t0 + uint(s), t0 + uint(la), t0 + uint(e)
        if not (start <= launch <= end and uint(i0) <= uint(i1)):
            raise ValueError("a split that ends before it starts")
        p.splits.append(Split(uint(d), i0, i1, start, launch, end))
    n = len(p.splits)
    for k, node, name, nbytes, src, dst, s, d in _rows(rec, "copies", 8):
        p.copies.append(
            Copy(
                _split_ref(k, n, False), uint(node, -1), _text(name), uint(nbytes), uint(src),
                uint(dst), t0 + uint(s), uint(d),
            )
        )  # fmt: skip
    for d, s, dur, k, n_ops in _rows(rec, "busy", 5):
        p.busy.append(Busy(uint(d), t0 + uint(s), uint(dur), _split_ref(k, n, True), uint(n_ops)))
    for d, method, err in _rows(rec, "clocks", 3):
        p.clocks.append(Clock(uint(d), _text(method), uint(err)))
    for row in _rows(rec, "remote", 11):
        k, d, send, reply, s, e, one_way, err, offset, nbytes, n_ops = row
        if uint(s) > uint(e) or uint(send) > uint(reply):
            raise ValueError("a remote graph that ends before it starts")
        p.remote.append(
            Remote(
                _split_ref(k, n, True), uint(d), t0 + send, t0 + reply, t0 + s, t0 + e,
                uint(one_way), uint(err), uint(offset, -(1 << 62)), uint(nbytes), uint(n_ops),
            )
        )  # fmt: skip
    if rec.get("wait") is not None:
        p.wait = uint(rec["wait"])
    return p


_PHASES = ("load", "step", "between")


def transfers(rec: dict[str, Any]) -> Transfers:
    """A ``transfers`` record, times made absolute (strict, as ``placement``)."""
    phase = rec["phase"]
    if phase not in _PHASES:
        raise ValueError(f"unknown transfers phase {phase!r}")
    t0 = uint(rec["t_start"])
    rows = []
    for row in _rows(rec, "rows", 10):
        d, cmd, tensor, nbytes, sent, recv, q, s, sa, e = row
        q, s, sa, e = uint(q), uint(s), uint(sa), uint(e)
        if not q <= s <= sa <= e:
            raise ValueError("a transfer whose times are out of order")
        rows.append(
            TransferRow(
                uint(d, -1), _text(cmd), _text(tensor), uint(nbytes), uint(sent), uint(recv),
                t0 + q, t0 + s, t0 + sa, t0 + e,
            )
        )  # fmt: skip
    in_step = phase == "step"
    return Transfers(
        phase=phase,
        ctx=uint(rec["ctx"]) if in_step else None,
        step=uint(rec["step"]) if in_step else None,
        dropped=uint(rec.get("dropped", 0)),
        rows=rows,
    )


def attach_stats(compute: Compute, rec: dict[str, Any]) -> None:
    """A tensor_stats record's rows, on the ops of the nodes they name."""
    by_node = {row[0]: tuple(row[1:]) for row in rec["stats"]}
    if compute.graph is None:
        return
    nodes = compute.graph.nodes
    for k, i in enumerate(compute.op_node.tolist()):
        stats = by_node.get(nodes[i].i)
        if stats is not None:
            compute.op_stats[k] = stats


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


def request_id(rec: dict[str, Any]) -> str | None:
    r = rec.get("request")
    return str(r) if r is not None else None


def step_seqs(rec: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """step_begin.seqs: [seq, n_tokens, first pos, last pos] per sequence (well-formed rows)."""
    out = []
    for row in rec.get("seqs") or []:
        if isinstance(row, list) and len(row) == 4:
            out.append((int(row[0]), int(row[1]), int(row[2]), int(row[3])))
    return out


def topk_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
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


def end_step(step: Any, rec: dict[str, Any]) -> None:
    """What a step_end record says of its step (a ``Step``, or the bulk reader's own kind)."""
    step.start = nonneg(rec["t_start"])
    step.dur = nonneg(rec["dur"])
    step.status = int(rec["status"])
    step.n_outputs = int(rec["n_outputs"])
    step.kv_used = int(rec["kv_used"])
    step.ended = True


# --- the ops and layers packer --------------------------------------------------------------


class PackedOps:
    """A compute record's ``ops`` list as columns: ``arr`` rows (node, start offset, duration),
    each row's ``lo``/``hi``, the fused nodes by op position, and their smallest and largest node
    index. ``to_list()`` gives the list back, for the per-op reader."""

    __slots__ = ("arr", "lo", "hi", "fused", "f_lo", "f_hi")

    def __init__(
        self, arr: Any, fused: dict[int, list[int]], f_lo: int = 0, f_hi: int = -1
    ) -> None:
        self.arr = arr
        self.lo: list[int] = arr.min(axis=1).tolist()
        self.hi: list[int] = arr.max(axis=1).tolist()
        self.fused, self.f_lo, self.f_hi = fused, f_lo, f_hi

    def to_list(self) -> list[list[Any]]:
        ops: list[list[Any]] = self.arr.T.tolist()
        for k, f in self.fused.items():
            ops[k].append(f)
        return ops


def pack_ops(ops: Any, last: dict[int, list[int]] | None = None) -> PackedOps | None:
    """``ops`` (a compute record's list of ``[i, start, dur]`` or ``[i, start, dur, [j, ...]]``)
    as columns, or None if any entry is unusual (the per-op reader then decides). ``last``: the
    fused ops of the graph's previous compute, which every generation step repeats (reused, not
    rebuilt, when they match)."""
    try:
        if not isinstance(ops, list) or not ops:
            return None
        n = len(ops)
        # int64 conversion is int()'s, as the per-op reader's, but fails beyond 64 bits (and on
        # short or odd entries): those records are left to the per-op reader
        arr = np.empty((3, n), dtype=np.int64)
        for k in range(3):
            arr[k] = np.fromiter(map(_ITEM[k], ops), dtype=np.int64, count=n)
        extra = sum(map(len, ops)) - 3 * n  # elements beyond (node, offset, duration)
        if not extra:
            return PackedOps(arr, {})
        if (
            last is not None
            and len(last) == extra
            and all(len(ops[k]) == 4 and ops[k][3] == f for k, f in last.items())
        ):
            fused = last
        else:
            lens = np.fromiter(map(len, ops), dtype=np.int64, count=n)
            pos = np.flatnonzero(lens > 3).tolist()
            lists = [ops[k][3] for k in pos]
            if set(map(type, lists)) != {list} or any(len(ops[k]) != 4 for k in pos):
                return None
            fused = dict(zip(pos, lists, strict=True))
        flat = list(chain.from_iterable(fused.values()))
        if not flat:
            return PackedOps(arr, fused)
        if set(map(type, flat)) != {int}:
            return None
        return PackedOps(arr, fused, min(flat), max(flat))
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None
