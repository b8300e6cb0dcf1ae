"""What each op cost in measured runs, fitted per op class: the prices ``instr predict`` puts on
the nodes of a graph that has not run.

An op's class is the device and thread count that ran it, the rows it works on (one, a few, tens
or hundreds: ``token_class`` of ``rows``: a matmul's output rows, else the ubatch's tokens), its op (``MUL_MAT``, ``GLU:SWIGLU``...), the type of its first source (a matmul's
weight type, or the KV cache's) and its role in the model (its node name without the layer:
``Qcur``, ``ffn_up``, ``kq``). Within a class an op's time is fitted as

    dur = fixed + slope * work,    work = max(bytes / bandwidth, FLOPs / compute)

``work`` is the op's time at the device's roofs (``derive``'s bytes and FLOPs), the roofs being
the best rates the logs themselves reached on that device (the 95th percentile of achieved GB/s
over all ops, and of GFLOP/s over the matmuls of each type): a fitted efficiency against the roof,
plus a fixed cost per op (the device's: its ops' 5th percentile of time). The slope is fitted by
least squares over every size the class was seen at (prompts at several depths, say), and a
class seen at one size is scaled from it. A class no log has at this row count is priced from the
nearest row count that has it and whose ops did as much work (a prompt of 512 tokens prices one of
127; a ubatch of 4 tokens is priced from a prompt's ops, not generation's), or else the nearest. An
op of a class no log has (a weight type never run, another device) is not priced: it is
reported, never guessed. (A CPU thread count no log ran takes its classes from one the logs ran,
with the bandwidth and cost of a split measured at both: ``op_threads``.) Nor is an op's time
extrapolated beyond the sizes its class was measured at: a node whose work is more than
``BEYOND`` times the most work its class's ops did in the logs (``Fit.work_hi``: a prompt of
100,000 tokens from logs of 26) is reported with how far beyond it is (``beyond``), so that the
prediction says what run would measure it, except attention on more KV cells than the logs read:
its work grows with them, and it is priced on its class's line per cell, labelled an
extrapolation (``extrapolated``; flash attention by the cells its rows see, and how far:
``kv_costs``). Of the rest, work below the least measured is priced, the line being anchored at the device's
fixed cost per op. Two kinds of op the device did run stand in for a class it did not (``proxy``),
and the prediction names each: a matmul or get_rows of a weight type the logs ran on another device
only (the output projection of a model whose output layer was offloaded, on the CPU at -ngl 0) is
priced from the same device's ops of that op on another type, at its own work at the roofs; and an
element-wise binary op (``ADD``, ``SUB``, ``MUL``, ``DIV``: one kernel on each backend) from
another binary op of the same device and type.

Nodes that never run on their own are free: views (``noop``) and nodes a backend fused into
another op, which the logs show as nodes of their graphs that were never timed. A role no log
ran on a device is fused there when the logs' device fused every node of its op that read the
same op's output on the same device (the CPU's ``RMS_NORM`` then ``MUL``: the output norm, on the
CPU at -ngl 0 only).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.converters.analysis.probe_shapes import weight_shape
from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session import derive
from llamacpp_instr.deciding.prediction import kv_costs, split_costs
from llamacpp_instr.deciding.prediction.thread_scale import ThreadScale, split_units

_LAYER_SUFFIX = re.compile(r"-\d+$")

# percentiles of the logs' own rates taken as the roofs, and of op times as the fixed cost
ROOF_PERCENTILE = 95
FIXED_PERCENTILE = 5
# how far beyond the most work a class's ops did in the logs a node may go and still be priced
# (a prompt a token longer than the logged one): past that, the price would be an extrapolation
BEYOND = 1.10
# ggml's element-wise binary ops: one kernel per backend for the four (ggml-cpu's binary-ops.cpp,
# ggml-vulkan's binary shaders), so that one prices another on the same device
BINARY_OPS = ("ADD", "SUB", "MUL", "DIV")
# ops whose first source is a weight, whose class a weight type run elsewhere may borrow
WEIGHT_OPS = ("MUL_MAT", "GET_ROWS")


def role(name: str) -> str:
    """A node's role in the model: its name without the layer (``Qcur-12`` -> ``Qcur``)."""
    return _LAYER_SUFFIX.sub("", name)


def src0_type(node: Node, graph: Graph) -> str:
    """The type of a node's first source: a matmul's weight type, or ``kv f16`` where it reads
    the KV cache (an attention matmul: another kernel than a weight's of the same type)."""
    if not node.src:
        return node.dtype
    # flash attention's first source is the query: the cache it reads is its second
    s = node.src[1] if node.op == "FLASH_ATTN_EXT" and len(node.src) > 1 else node.src[0]
    t = graph.nodes[int(s["node"])].dtype if "node" in s else str(s.get("type", node.dtype))
    return f"kv {t}" if "kv_read" in node.flags else t


def rows(node: Node, graph: Graph) -> int:
    """The rows a node works on: a matmul's are its output's second dimension (the tokens, or
    one for the output projection of the last token only), an expert matmul's (MUL_MAT_ID,
    ``[rows, experts used, tokens]``) its third; any other op's, the ubatch's tokens."""
    if node.op == "MUL_MAT_ID":
        return int(node.shape[2]) if len(node.shape) >= 3 else 1
    if node.op.startswith("MUL_MAT") and len(node.shape) >= 2:
        return int(node.shape[1])
    if node.op.startswith("MUL_MAT"):
        return 1
    return graph.n_tokens


@dataclass
class GraphCosts:
    """A graph's nodes as the cost model sees them, one entry per node."""

    graph: Graph
    roles: list[str]
    labels: list[str]
    types: list[str]
    bytes: np.ndarray
    flops: np.ndarray
    noop: np.ndarray  # bool: a view that never runs
    tokens: list[str]  # each node's size class (``token_class`` of its rows)
    units: np.ndarray  # int: the parts the CPU splits each node into (``split_units``)
    kv: np.ndarray  # bool: an attention op, whose work grows with the KV cells read (``kv_nodes``)

    @classmethod
    def of(cls, g: Graph) -> GraphCosts:
        n = len(g.nodes)
        b = np.zeros(n, np.float64)
        f = np.zeros(n, np.float64)
        noop = np.zeros(n, bool)
        for k, node in enumerate(g.nodes):
            noop[k] = "noop" in node.flags or 0 in node.shape
            if not noop[k]:
                b[k] = derive.bytes_moved(node, g)
                f[k] = derive.flops(node, g)
        return cls(
            graph=g,
            roles=[role(x.name) for x in g.nodes],
            labels=[x.label for x in g.nodes],
            types=[src0_type(x, g) for x in g.nodes],
            bytes=b,
            flops=f,
            noop=noop,
            tokens=[token_class(rows(x, g)) for x in g.nodes],
            units=np.array([split_units(x, g) for x in g.nodes], np.int64),
            kv=kv_nodes(g),
        )


def kv_nodes(g: Graph) -> np.ndarray:
    """The nodes whose work grows with the KV cells a compute reads: those reading the cache
    (``kv_read``: the KQ and KQV matmuls, flash attention) and the ops on the way from one to
    another (KQ's softmax, a scale or soft cap before it), not what follows the last (KQV's
    permute, whose size is the heads')."""
    n = len(g.nodes)
    read = np.array(["kv_read" in x.flags for x in g.nodes], bool)
    after = np.zeros(n, bool)  # reached from a kv_read node through ops other than matmuls
    for k, node in enumerate(g.nodes):
        src = first_source(g, k)
        if src is not None and not node.op.startswith("MUL_MAT") and not read[k]:
            after[k] = bool(read[src] or after[src])
    before = np.zeros(n, bool)  # read, through such ops, by a kv_read node
    for k in range(n - 1, -1, -1):
        if read[k] or (before[k] and after[k]):
            for s_ in g.nodes[k].src:
                if "node" in s_:
                    before[int(s_["node"])] = True
    return read | (after & before)


@dataclass(frozen=True)
class Where:
    """What ran an op: a device, at a thread count (the CPU's; 0 for another device)."""

    device: str
    threads: int

    def __str__(self) -> str:
        return f"{self.device} ({self.threads} threads)" if self.threads else self.device


@dataclass
class Fit:
    """One class's fitted time: ``fixed + slope * work`` (ns), and the least and most work (ns at
    the roofs) its ops did in the logs."""

    fixed: float
    slope: float
    work_lo: float
    work_hi: float
    n: int

    def time(self, work: np.ndarray) -> np.ndarray:
        return self.fixed + self.slope * work

    def beyond(self, work: float) -> float:
        """How many times the most work measured ``work`` is where that is more than ``BEYOND``
        (an extrapolation), else 0."""
        if work <= self.work_hi * BEYOND:
            return 0.0
        return work / self.work_hi if self.work_hi > 0 else float("inf")


@dataclass
class Roofs:
    """A device's roofs as its logs reached them: bytes/ns, and FLOPs/ns per matmul type."""

    bandwidth: float
    compute: dict[str, float]
    compute_any: float
    fixed: float  # the fixed cost of an op (ns)

    def work(
        self, labels: Sequence[str], types: Sequence[str], b: np.ndarray, f: np.ndarray
    ) -> np.ndarray:
        comp = np.array(
            [
                (
                    self.compute.get(t.removeprefix("kv "), self.compute_any)
                    if lab.startswith("MUL_MAT")
                    else self.compute_any
                )
                for lab, t in zip(labels, types, strict=True)
            ],
            np.float64,
        )
        mem = b / self.bandwidth if self.bandwidth > 0 else np.zeros(len(b))
        return np.maximum(mem, np.divide(f, comp, out=np.zeros(len(f)), where=comp > 0))


ClassKey = tuple[Where, str, str, str, str]  # where, tokens, label, type, role ("" for any)


@dataclass
class _Pass:
    """One graph priced (``CostModel.price``) from ``model``: what it is asked, what it gathers,
    and each node's price (``price_node``)."""

    model: CostModel
    gc: GraphCosts
    devices: Sequence[str]
    threads: int
    proxies: dict[str, None] | None
    beyond: dict[tuple[str, str, str, str], float] | None
    bound: dict[tuple[str, str], float] | None
    extrapolated: dict[tuple[str, str, str, str], float] | None
    cells: float | None
    scale: ThreadScale | None = None
    out: np.ndarray = field(init=False)
    missing: dict[tuple[str, str, str, str], None] = field(default_factory=dict)
    works: dict[Where, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out = np.zeros(len(self.gc.roles))

    def device(self, k: int) -> str:
        return self.devices[k] if k < len(self.devices) and self.devices[k] else "CPU"

    def own_work(self, where: Where, k: int) -> float | None:
        """Node ``k``'s work at ``where``'s roofs (each device's worked out once a pass)."""
        roofs = self.model.roofs.get(where)
        if roofs is None:
            return None
        if where not in self.works:
            gc = self.gc
            self.works[where] = roofs.work(gc.labels, gc.types, gc.bytes, gc.flops)
        return float(self.works[where][k])

    def price_node(self, k: int) -> None:
        """Node ``k``'s time into ``self.out``, or its class into ``self.missing`` (``price``)."""
        gc = self.gc
        dev = self.device(k)
        where = Where(dev, self.threads if dev == "CPU" else 0)
        if self.scale is not None and dev == "CPU":
            where = Where("CPU", self.scale.source.threads)
        lab, typ, rol = gc.labels[k], gc.types[k], gc.roles[k]
        if (where, lab, rol) in self.model.fused:
            return
        if (where, lab, rol) not in self.model.timed:
            src = first_source(gc.graph, k)
            if (
                src is not None
                and self.device(src) == dev
                and (where, lab, gc.labels[src]) in self.model.fused_after
            ):
                return
        roofs = self.model.roofs.get(where)
        own = self.own_work(where, k)
        fit = self.model.lookup(where, gc.tokens[k], lab, typ, rol, own)
        # as the class's own: its label, its type, its bytes
        as_lab, as_typ, n_bytes = lab, typ, gc.bytes[k : k + 1]
        if fit is None:
            found = self.proxied(k, where)
            if found is not None:
                fit, as_lab, as_typ, n_bytes = found
        if fit is None or roofs is None:
            self.missing[(str(where), lab, typ, gc.tokens[k])] = None
            return
        if (as_lab, as_typ) == (lab, typ) and own is not None:
            w = np.array([own])
        else:
            w = roofs.work([as_lab], [as_typ], n_bytes, gc.flops[k : k + 1])
        self.out[k] = float(fit.time(w)[0])
        fixed, far = fit.fixed, fit.beyond(float(w[0]))
        line = self.model.flash.get((where, typ)) if lab == kv_costs.FLASH else None
        if line is not None and self.cells is not None:
            # by the cells its rows see, not those its view spans (masked ones are skipped)
            self.out[k] = line.time(gc.graph.n_tokens, self.cells)
            fixed = line.fixed
            far = self.cells / line.cells_hi if self.cells > line.cells_hi * BEYOND else 0.0
        if self.scale is not None and dev == "CPU":  # at the target's thread count
            self.at_threads(k, fixed, as_lab, as_typ, float(n_bytes[0]))
        cls = (str(where), lab, typ, gc.tokens[k])
        if far and gc.kv[k]:
            # an attention op on more KV cells than the logs': its line, per cell
            if self.extrapolated is not None:
                self.extrapolated[cls] = max(self.extrapolated.get(cls, 0.0), far)
        elif far and self.beyond is not None:
            self.beyond[cls] = max(self.beyond.get(cls, 0.0), far)

    def proxied(self, k: int, where: Where) -> tuple[Any, str, str, np.ndarray] | None:
        """Node ``k``, a class its device never ran, priced from another of its kind there
        (``proxy``): the fit, the label and type it is priced as, its bytes at that type; said
        in ``self.proxies``. None where there is none."""
        gc = self.gc
        lab, typ = gc.labels[k], gc.types[k]
        found = proxy(self.model, where, gc.tokens[k], lab, typ)
        if found is None:
            return None
        fit, as_lab, as_typ, as_tokens = found
        n_bytes = gc.bytes[k : k + 1]
        if as_typ != typ:
            # the same op with weights of the type run: their bytes at its size
            weights = derive.weight_bytes_read(gc.graph.nodes[k], gc.graph)
            ratio = _type_size(as_typ) / _type_size(typ)
            n_bytes = n_bytes + weights * (ratio - 1)
        if self.proxies is not None:
            of = f" of {typ}" if typ else ""
            self.proxies[
                f"{lab}{of} in ubatches of {gc.tokens[k]} token(s) on {where}: no "
                f"log ran it there; priced as the device's {as_lab} of {as_typ} "
                f"(ubatches of {as_tokens} token(s)) of its shape"
            ] = None
        return fit, as_lab, as_typ, n_bytes

    def at_threads(self, k: int, fixed: float, as_lab: str, as_typ: str, n_bytes: float) -> None:
        """A CPU node's time moved to the target's thread count (``self.scale``), and said in
        ``self.bound`` by what it is there."""
        assert self.scale is not None
        gc = self.gc
        lab, typ = gc.labels[k], gc.types[k]
        weight = as_typ if as_lab.startswith("MUL_MAT") and "kv " not in as_typ else ""
        columns = rows(gc.graph.nodes[k], gc.graph) if weight else 0
        time, what = self.scale.time(
            self.out[k] - fixed, n_bytes, weight, gc.roles[k], int(gc.units[k]), columns,
            weight_shape(gc.graph.nodes[k], gc.graph) if columns == 1 else None,
        )  # fmt: skip
        self.out[k] = fixed + time
        if self.bound is not None:
            op = f"{lab} {typ}" if lab.startswith(WEIGHT_OPS) or typ.startswith("kv ") else lab
            self.bound[(what, op)] = self.bound.get((what, op), 0.0) + self.out[k]


@dataclass
class CostModel:
    """The fitted classes, the roofs and fixed costs per device, the roles backends fuse, and the
    host's time per compute outside its ops."""

    fits: dict[ClassKey, Fit]
    roofs: dict[Where, Roofs]
    fused: set[tuple[Where, str, str]]  # (where, label, role) of nodes run inside another op
    overhead: dict[tuple[Where, str], float]  # (where, kind) -> ns per compute outside the ops
    # (where, label, role) of the nodes timed; (where, label, label of its first source) of an op
    # the device ran only inside the op before it (a backend's fusion), and the types run
    timed: set[tuple[Where, str, str]] = field(default_factory=set)
    fused_after: set[tuple[Where, str, str]] = field(default_factory=set)
    types_run: set[str] = field(default_factory=set)
    # on several devices: a split's time beyond its ops, and the copies between devices
    splits: split_costs.SplitCosts = field(default_factory=split_costs.SplitCosts)
    # per kind: each of the logs' own steps' measured time over the model's price of it (the
    # spread), and the level: per log, its steps' measured time over their price summed, and
    # the median of that over the logs (one log slowed by another process moves it little)
    self_ratios: dict[str, np.ndarray] = field(default_factory=dict)
    self_level: dict[str, float] = field(default_factory=dict)
    # the level per kind and the devices the logs' steps of that kind computed on
    self_level_on: dict[tuple[str, frozenset[str]], float] = field(default_factory=dict)
    # the level and the host's time per compute of the steps that did not start their context
    # (``op_fit.cold_step``: what a run at a depth is made of)
    self_level_warm: dict[str, float] = field(default_factory=dict)
    overhead_warm: dict[tuple[Where, str], float] = field(default_factory=dict)
    experts: Any = None  # a MoE's measured traffic (``expert_traffic``; None: no routing)
    # per kind, leave one out: each log's measured time over the model of the other logs'
    # prediction of it, as a natural log, for the logs the others cover (op_fit._held_out); and
    # of the logs priced at a thread count the others did not run (``ThreadScale``)
    held_out: dict[str, list[float]] = field(default_factory=dict)
    held_out_threads: dict[str, list[float]] = field(default_factory=dict)
    # the CPU at thread counts no log ran, priced from one the logs ran (thread_scale), and the
    # bandwidth (bytes/ns) the logs' steps reached per device and weight type ("": every op),
    # their ops' bytes over their time, the best step's (op_fit._stream)
    scaled: dict[Where, ThreadScale] = field(default_factory=dict)
    stream: dict[tuple[Where, str], float] = field(default_factory=dict)
    # flash attention's time per row and per KV cell its rows see, per (where, cache type), and
    # the most KV cells the logs' computes read (kv_costs)
    flash: dict[tuple[Where, str], kv_costs.RowLine] = field(default_factory=dict)
    max_kv: int = 0

    def overhead_at(self, threads: int, kind: str, warm: bool = False) -> float:
        """The host's time per compute outside its ops at ``threads`` (a scaled thread count's:
        its source's, the host's own work not being spread over the threads, with the start of
        the target's threads for the source's: ``ThreadScale.start_ns``); ``warm``: of the
        steps that did not start their context (where the logs' steps of this kind all did,
        the least of the other kinds': a run at a depth pays no context's start)."""
        scale = self.scaled.get(Where("CPU", threads))
        where = Where("CPU", scale.source.threads if scale else threads)
        start = scale.start_ns() if scale else 0.0
        if warm:
            found = self.overhead_warm.get((where, kind))
            others = [v for (w, _k), v in self.overhead_warm.items() if w == where]
            if found is not None or others:
                return max((found if found is not None else min(others)) + start, 0.0)
        return max(self.overhead.get((where, kind), 0.0) + start, 0.0)

    def has(self, where: Where) -> bool:
        return where in self.roofs

    def level(self, kind: str, devices: frozenset[str], warm: bool = False) -> float | None:
        """The measured-over-priced level of ``kind`` steps on ``devices``: of the logs whose
        steps computed on those devices. Steps on other devices than any log's are priced at the
        model's own level (1): a correction the logs measured on other devices (lavapipe's, say)
        says nothing of these (a CPU's alone, at -ngl 0); the spread still bounds the interval.
        ``warm``: of the steps that did not start their context (the model's own level where
        every step of the kind did: a prompt after a depth pays none of a context's start)."""
        if warm:
            return self.self_level_warm.get(kind, 1.0)
        found = self.self_level_on.get((kind, devices))
        if found is not None:
            return found
        if any(k == kind for k, _ in self.self_level_on):
            return 1.0
        return self.self_level.get(kind)

    def price(
        self,
        gc: GraphCosts,
        devices: Sequence[str],
        threads: int,
        proxies: dict[str, None] | None = None,
        beyond: dict[tuple[str, str, str, str], float] | None = None,
        bound: dict[tuple[str, str], float] | None = None,
        extrapolated: dict[tuple[str, str, str, str], float] | None = None,
        cells: float | None = None,
    ) -> tuple[np.ndarray, list[tuple[str, str, str, str]]]:
        """Each node's predicted time (ns), its device by ``devices`` (the CPU where not given),
        and the classes no log has, as (where, op, type, size class). A class priced from other
        ops of its device (``proxy``) is added to ``proxies``, saying from which; a node whose
        work is beyond what its class measured (``Fit.beyond``) to ``beyond``, as its class and
        the most times the measured work such a node of it does, unless it is an attention op
        (``GraphCosts.kv``: priced on its class's line per KV cell, it is added to
        ``extrapolated`` the same way; ``kv_costs`` bounds how far). Flash attention is priced by
        the KV ``cells`` the compute's rows see where given (``kv_costs.RowLine``). At a thread
        count no log ran,
        each CPU node's time is added to ``bound`` under what it is and its op (``thread_scale``:
        ``(memory-bound, "MUL_MAT q4_1")``)."""
        p = _Pass(self, gc, devices, threads, proxies, beyond, bound, extrapolated, cells)
        p.scale = self._scaled(threads, gc.graph)
        for k in range(len(gc.roles)):
            if not gc.noop[k]:
                p.price_node(k)
        return p.out, list(p.missing)

    def _scaled(self, threads: int, graph: Graph) -> ThreadScale | None:
        """The CPU at a thread count no log ran, None where a log ran it: its classes are the
        source's (``ThreadScale``), its probe made ready for ``graph``'s matmuls."""
        scale = self.scaled.get(Where("CPU", threads))
        if scale is not None and scale.probe is not None:
            scale.probe.prepare(graph)
        return scale

    def price_compute(
        self,
        gc: GraphCosts,
        devices: Sequence[str],
        threads: int,
        kind: str,
        resend: bool = True,
        held: split_costs.Holders | None = None,
        proxies: dict[str, None] | None = None,
        beyond: dict[tuple[str, str, str, str], float] | None = None,
        bound: dict[tuple[str, str], float] | None = None,
        extrapolated: dict[tuple[str, str, str, str], float] | None = None,
        cells: float | None = None,
    ) -> tuple[np.ndarray, dict[str, float], list[tuple[str, str, str, str]], list[str]]:
        """One compute of a graph in a ``kind`` step: each node's time, the time beyond the ops
        of its splits per device and of its copies (``split_costs``, where it runs on several
        devices; ``resend``: another graph than the previous compute's, sent whole to an RPC
        server; ``held``: the device holding each weight, whose copies to another device are
        priced), the op classes no log has and what else no log has (``proxies``, ``beyond``, ``bound``,
        ``extrapolated``, ``cells``: as ``price``)."""
        gc, shares = _routed(self.experts, gc)
        cost, missing = self.price(
            gc, devices, threads, proxies, beyond, bound, extrapolated, cells
        )
        used = {d for d, nop in zip(devices, gc.noop, strict=False) if not nop}
        if len(used) <= 1:
            return cost, {}, missing, []
        extra, lost = split_costs.across_devices(
            gc.graph, gc.noop, devices, self.splits, kind, resend, held, shares
        )
        return cost, extra, missing, lost

    def lookup(
        self,
        where: Where,
        tokens: str,
        label: str,
        typ: str,
        role_: str,
        work: float | None = None,
    ) -> Fit | None:
        """The closest fitted class: this role at this row count, then at the nearest one that
        has it (a prompt of 512 tokens prices one of 127); then any role of the op the same
        way. Given the node's ``work``, the first whose ops did as much work (``Fit.beyond``: a
        ubatch of 4 tokens from a prompt's class rather than from generation's, which did 4x
        less; a prompt of 127 tokens from one of 512 rather than from ubatches of 32), else the
        closest. (A single row's class is taken as it is where there is one: a token at a depth
        no log generated at is not priced from a prompt's matmuls.)"""
        order = sorted(
            TOKEN_NAMES, key=lambda t: abs(TOKEN_NAMES.index(t) - TOKEN_NAMES.index(tokens))
        )
        closest = None
        for r in (role_, ""):
            for t in order:
                found = self.fits.get((where, t, label, typ, r))
                if found is None:
                    continue
                if work is None or not found.beyond(work) or (t == tokens == "1"):
                    return found
                closest = closest or found
        return closest


def proxy(
    model: CostModel, where: Where, tokens: str, label: str, typ: str
) -> tuple[Fit, str, str, str] | None:
    """A class no log has, priced from a class of its kind the same device ran (module
    docstring), at the nearest size class: that class's fit, label, type and size class."""
    order = sorted(TOKEN_NAMES, key=lambda t: abs(TOKEN_NAMES.index(t) - TOKEN_NAMES.index(tokens)))
    if label in BINARY_OPS:
        for t in order:
            for other in BINARY_OPS:
                found = model.fits.get((where, t, other, typ, ""))
                if other != label and found is not None:
                    return found, other, typ, t
    # a weight type never run at all has no measure of its kernels anywhere: not priced
    if (
        label in WEIGHT_OPS
        and typ in model.types_run
        and not typ.startswith("kv ")
        and _type_size(typ) > 0
    ):
        for t in order:
            have = [
                (f.n, k[3], f)
                for k, f in model.fits.items()
                if k[0] == where and k[1] == t and k[2] == label and k[4] == ""
                if k[3] != typ and not k[3].startswith("kv ") and _type_size(k[3]) > 0
            ]
            if have:
                _, other, found = max(have, key=lambda h: (h[0], h[1]))
                return found, label, other, t
    return None


def _routed(traffic: Any, gc: GraphCosts) -> tuple[GraphCosts, dict[int, float]]:
    """``gc`` with its expert matmuls at the experts the logs' routing used, and the share of
    each one's experts (``expert_traffic.ExpertTraffic``; as it is without routing)."""
    if not traffic:
        return gc, {}
    return traffic.routed(gc), traffic.node_shares(gc.graph, gc.tokens)


def first_source(g: Graph, k: int) -> int | None:
    """The node a node's first source is (None for a leaf: a weight, an input)."""
    src = g.nodes[k].src
    return int(src[0]["node"]) if src and "node" in src[0] else None


def _type_size(name: str) -> float:
    """Bytes per element of a ggml type (a quantized one's block over its elements), 0 where
    unknown."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    except KeyError:
        return 0.0
    return size / block


# the ubatch sizes an op class is split by (its lower bounds): one token (matrix-vector
# products), a few, tens, hundreds; a kernel's efficiency differs between them
TOKEN_CLASSES = (1, 2, 16, 128)


TOKEN_NAMES = ["1"] + [f"{b}+" for b in TOKEN_CLASSES[1:]]


def token_class(n_rows: int) -> str:
    """The size class of an op on ``n_rows`` rows (``1``, ``2+``, ``16+``, ``128+``)."""
    low = max(b for b in TOKEN_CLASSES if b <= max(n_rows, 1))
    return "1" if low == 1 else f"{low}+"
