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
nearest row count that has it (a prompt of 127 tokens prices one of 512). An op of a class no log has (a
weight type never run, another thread count, another device) is not priced: it is reported, never
guessed. Two kinds of op the device did run stand in for a class it did not (``proxy``), and the
prediction names each: a matmul or get_rows of a weight type the logs ran on another device only
(the output projection of a model whose output layer was offloaded, on the CPU at -ngl 0) is
priced from the same device's ops of that op on another type, at its own work at the roofs; and
an element-wise binary op (``ADD``, ``SUB``, ``MUL``, ``DIV``: one kernel on each backend) from
another binary op of the same device and type.

Nodes that never run on their own are free: views (``noop``) and nodes a backend fused into
another op, which the logs show as nodes of their graphs that were never timed. A role no log
ran on a device is fused there when the logs' device fused every node of its op that read the
same op's output on the same device (the CPU's ``RMS_NORM`` then ``MUL``: the output norm, on the
CPU at -ngl 0 only).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.graphs import Graph, Node
from ..session import derive
from . import net_costs, split_costs

_LAYER_SUFFIX = re.compile(r"-\d+$")

# percentiles of the logs' own rates taken as the roofs, and of op times as the fixed cost
ROOF_PERCENTILE = 95
FIXED_PERCENTILE = 5
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
    one for the output projection of the last token only); any other op's, the ubatch's tokens."""
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
        )


@dataclass(frozen=True)
class Where:
    """What ran an op: a device, at a thread count (the CPU's; 0 for another device)."""

    device: str
    threads: int

    def __str__(self) -> str:
        return f"{self.device} ({self.threads} threads)" if self.threads else self.device


@dataclass
class Fit:
    """One class's fitted time: ``fixed + slope * work`` (ns), and the sizes it was seen at."""

    fixed: float
    slope: float
    work_lo: float
    work_hi: float
    n: int

    def time(self, work: np.ndarray) -> np.ndarray:
        return self.fixed + self.slope * work


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

    def has(self, where: Where) -> bool:
        return where in self.roofs

    def level(self, kind: str, devices: frozenset[str]) -> float | None:
        """The measured-over-priced level of ``kind`` steps on ``devices``: of the logs whose
        steps computed on those devices. Steps on other devices than any log's are priced at the
        model's own level (1): a correction the logs measured on other devices (lavapipe's, say)
        says nothing of these (a CPU's alone, at -ngl 0); the spread still bounds the interval."""
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
    ) -> tuple[np.ndarray, list[tuple[str, str, str, str]]]:
        """Each node's predicted time (ns), its device by ``devices`` (the CPU where not given),
        and the classes no log has, as (where, op, type, size class). A class priced from other
        ops of its device (``proxy``) is added to ``proxies``, saying from which."""
        n = len(gc.roles)
        out = np.zeros(n)
        missing: dict[tuple[str, str, str, str], None] = {}

        def device(k: int) -> str:
            return devices[k] if k < len(devices) and devices[k] else "CPU"

        for k in range(n):
            if gc.noop[k]:
                continue
            dev = device(k)
            where = Where(dev, threads if dev == "CPU" else 0)
            lab, typ, rol = gc.labels[k], gc.types[k], gc.roles[k]
            if (where, lab, rol) in self.fused:
                continue
            if (where, lab, rol) not in self.timed:
                src = _first_source(gc.graph, k)
                if (
                    src is not None
                    and device(src) == dev
                    and (where, lab, gc.labels[src]) in self.fused_after
                ):
                    continue
            fit = self.lookup(where, gc.tokens[k], lab, typ, rol)
            # as the class's own: its label, its type, its bytes
            as_lab, as_typ, n_bytes = lab, typ, gc.bytes[k : k + 1]
            if fit is None:
                found = self.proxy(where, gc.tokens[k], lab, typ)
                if found is not None:
                    fit, as_lab, as_typ, as_tokens = found
                    if as_typ != typ:
                        # the same op with weights of the type run: their bytes at its size
                        weights = derive.weight_bytes_read(gc.graph.nodes[k], gc.graph)
                        ratio = _type_size(as_typ) / _type_size(typ)
                        n_bytes = n_bytes + weights * (ratio - 1)
                    if proxies is not None:
                        of = f" of {typ}" if typ else ""
                        proxies[
                            f"{lab}{of} in ubatches of {gc.tokens[k]} token(s) on {where}: no "
                            f"log ran it there; priced as the device's {as_lab} of {as_typ} "
                            f"(ubatches of {as_tokens} token(s)) of its shape"
                        ] = None
            roofs = self.roofs.get(where)
            if fit is None or roofs is None:
                missing[(str(where), lab, typ, gc.tokens[k])] = None
                continue
            w = roofs.work([as_lab], [as_typ], n_bytes, gc.flops[k : k + 1])
            out[k] = float(fit.time(w)[0])
        return out, list(missing)

    def price_compute(
        self,
        gc: GraphCosts,
        devices: Sequence[str],
        threads: int,
        kind: str,
        resend: bool = True,
        held: split_costs.Holders | None = None,
        proxies: dict[str, None] | None = None,
    ) -> tuple[np.ndarray, dict[str, float], list[tuple[str, str, str, str]], list[str]]:
        """One compute of a graph in a ``kind`` step: each node's time, the time beyond the ops
        of its splits per device and of its copies (``split_costs``, where it runs on several
        devices; ``resend``: another graph than the previous compute's, sent whole to an RPC
        server; ``held``: the device holding each weight, whose copies to another device are
        priced), the op classes no log has and what else no log has (``proxies``: as
        ``price``)."""
        cost, missing = self.price(gc, devices, threads, proxies)
        used = {d for d, nop in zip(devices, gc.noop, strict=False) if not nop}
        if len(used) <= 1:
            return cost, {}, missing, []
        extra, lost = split_costs.across_devices(
            gc.graph, gc.noop, devices, self.splits, kind, resend, held
        )
        return cost, extra, missing, lost

    def lookup(self, where: Where, tokens: str, label: str, typ: str, role_: str) -> Fit | None:
        """The closest fitted class: this role at this row count, then at the nearest one that
        has it (a prompt of 127 tokens prices one of 512); then any role of the op the same
        way."""
        order = sorted(
            TOKEN_NAMES, key=lambda t: abs(TOKEN_NAMES.index(t) - TOKEN_NAMES.index(tokens))
        )
        for r in (role_, ""):
            for t in order:
                found = self.fits.get((where, t, label, typ, r))
                if found is not None:
                    return found
        return None

    def proxy(
        self, where: Where, tokens: str, label: str, typ: str
    ) -> tuple[Fit, str, str, str] | None:
        """A class no log has, priced from a class of its kind the same device ran (module
        docstring), at the nearest size class: that class's fit, label, type and size class."""
        order = sorted(
            TOKEN_NAMES, key=lambda t: abs(TOKEN_NAMES.index(t) - TOKEN_NAMES.index(tokens))
        )
        if label in BINARY_OPS:
            for t in order:
                for other in BINARY_OPS:
                    found = self.fits.get((where, t, other, typ, ""))
                    if other != label and found is not None:
                        return found, other, typ, t
        # a weight type never run at all has no measure of its kernels anywhere: not priced
        if (
            label in WEIGHT_OPS
            and typ in self.types_run
            and not typ.startswith("kv ")
            and _type_size(typ) > 0
        ):
            for t in order:
                have = [
                    (f.n, k[3], f)
                    for k, f in self.fits.items()
                    if k[0] == where and k[1] == t and k[2] == label and k[4] == ""
                    if k[3] != typ and not k[3].startswith("kv ") and _type_size(k[3]) > 0
                ]
                if have:
                    _, other, found = max(have, key=lambda h: (h[0], h[1]))
                    return found, label, other, t
        return None


LogGraphs = dict[int, tuple[GraphCosts, list[str]]]


def log_graphs(frames: Any) -> LogGraphs:
    """Each graph a log's ops ran, by id: what its nodes cost is made of, and each node's device
    (at the graph's first compute), worked out once for the fit and its self-check."""
    out: LogGraphs = {}
    first = frames.ops.drop_duplicates("graph")[["graph", "step", "ubatch"]]
    for gid, step, ub in first.itertuples(index=False):
        g = frames.graphs.get(int(gid))
        if g is not None:
            devices = split_costs.node_devices(frames, int(step), int(ub), len(g.nodes))
            out[int(gid)] = (GraphCosts.of(g), devices)
    return out


def _op_frame(frames: Any, graphs: LogGraphs, where_of: Any) -> pd.DataFrame | None:
    """The timed ops of one session with their class and size, or None without ops."""
    ops = frames.ops
    if ops.empty:
        return None
    kinds = frames.steps.set_index("step")["kind"].astype(str)
    parts = []
    for gid, rows in ops.groupby("graph", sort=False):
        if int(gid) not in graphs:
            continue
        gc = graphs[int(gid)][0]
        idx = rows["node"].to_numpy()
        parts.append(
            pd.DataFrame(
                {
                    "graph": int(gid),
                    "node": idx,
                    "step": rows["step"].to_numpy(),
                    "ubatch": rows["ubatch"].to_numpy(),
                    "dur": rows["dur_ns"].to_numpy(np.float64),
                    "label": np.asarray(gc.labels, object)[idx],
                    "type0": np.asarray(gc.types, object)[idx],
                    "role": np.asarray(gc.roles, object)[idx],
                    "bytes": gc.bytes[idx],
                    "flops": gc.flops[idx],
                    "device": where_of(rows),
                    "tokens": np.asarray(gc.tokens, object)[idx],
                }
            )
        )
    if not parts:
        return None
    df = pd.concat(parts, ignore_index=True)
    # ops of prompt and generation steps only (not a K-shift's)
    step_kind = kinds.reindex(df["step"].to_numpy()).to_numpy()
    return df[np.isin(step_kind, ["prompt", "gen"])]


def _devices_of(frames: Any) -> Any:
    """A function giving the device of each op row: the ops frame's ``device`` where the log ran
    on several devices, else the CPU."""

    def of(rows: pd.DataFrame) -> np.ndarray:
        if "device" in rows.columns:
            return rows["device"].astype(str).to_numpy(object)
        return np.full(len(rows), "CPU", object)

    return of


def _type_size(name: str) -> float:
    """Bytes per element of a ggml type (a quantized one's block over its elements), 0 where
    unknown."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    except KeyError:
        return 0.0
    return size / block


def _first_source(g: Graph, k: int) -> int | None:
    """The node a node's first source is (None for a leaf: a weight, an input)."""
    src = g.nodes[k].src
    return int(src[0]["node"]) if src and "node" in src[0] else None


@dataclass
class _Fusion:
    """What a log's graphs say of fusion: (where, label, role) of nodes never timed and of nodes
    timed, and (where, label, label of the first source, on the same device) of each."""

    fused: set[tuple[Where, str, str]] = field(default_factory=set)
    timed: set[tuple[Where, str, str]] = field(default_factory=set)
    after_fused: set[tuple[Where, str, str]] = field(default_factory=set)
    after_timed: set[tuple[Where, str, str]] = field(default_factory=set)


def _fused_roles(frames: Any, graphs: LogGraphs, threads: int, out: _Fusion) -> None:
    """Nodes that are not views yet never timed in any compute of their graph: run inside another
    op (a backend's fusion), by their (where, label, role), where from the split holding the
    node; and the op before each, where it ran on the same device."""
    timed = frames.ops.groupby("graph")["node"].unique()
    for gid, nodes in timed.items():
        if int(gid) not in graphs:
            continue
        gc, device = graphs[int(gid)]
        seen = set(int(x) for x in nodes)
        for node in gc.graph.nodes:
            if "noop" in node.flags or 0 in node.shape:
                continue
            dev = device[node.i]
            where = Where(dev, threads if dev == "CPU" else 0)
            ran = node.i in seen
            (out.timed if ran else out.fused).add((where, node.label, role(node.name)))
            src = _first_source(gc.graph, node.i)
            if src is not None and device[src] == dev:
                after = (where, node.label, gc.graph.nodes[src].label)
                (out.after_timed if ran else out.after_fused).add(after)


def _roofs(df: pd.DataFrame) -> Roofs:
    d = df["dur"].to_numpy()
    ok = d > 0
    gbs = df["bytes"].to_numpy()[ok] / d[ok]
    bw = float(np.percentile(gbs, ROOF_PERCENTILE)) if len(gbs) else 0.0
    compute: dict[str, float] = {}
    mm = df[df["label"].str.startswith("MUL_MAT") & (df["dur"] > 0)]
    # (an attention matmul's roof is its cache type's: "kv f16" against f16)
    mm = mm.assign(type0=mm["type0"].str.removeprefix("kv "))
    for t, rows in mm.groupby("type0"):
        rate = rows["flops"].to_numpy() / rows["dur"].to_numpy()
        compute[str(t)] = float(np.percentile(rate, ROOF_PERCENTILE))
    any_rate = max(compute.values()) if compute else 0.0
    fixed = float(np.percentile(d, FIXED_PERCENTILE)) if len(d) else 0.0
    return Roofs(bandwidth=bw, compute=compute, compute_any=any_rate, fixed=fixed)


def _fit(work: np.ndarray, dur: np.ndarray, fixed: float) -> Fit:
    """The class's efficiency against the roof: the slope of its time over its work, through the
    device's fixed cost per op, by least squares over its distinct sizes (each its ops' median
    time, weighted by how many ops had it: a step slowed by another process moves it little).
    (A free intercept per class, fitted on the two or three sizes one run gives, took tens of
    milliseconds for a fixed cost.)"""
    sizes = pd.DataFrame({"w": work, "d": dur}).groupby("w")["d"].agg(["median", "count"])
    w = sizes.index.to_numpy(np.float64)
    m = sizes["median"].to_numpy()
    c = sizes["count"].to_numpy(np.float64)
    n = int(c.sum())
    a = min(fixed, float(m.min()))
    den = float(np.sum(c * w * w))
    slope = float(np.sum(c * w * (m - a)) / den) if den > 0 else 0.0
    if slope <= 0:  # no work (or no time beyond the fixed cost): the class's median time
        return Fit(fixed=float(np.average(m, weights=c)), slope=0.0, work_lo=0, work_hi=0, n=n)
    return Fit(fixed=a, slope=slope, work_lo=float(w.min()), work_hi=float(w.max()), n=n)


# the ubatch sizes an op class is split by (its lower bounds): one token (matrix-vector
# products), a few, tens, hundreds; a kernel's efficiency differs between them
TOKEN_CLASSES = (1, 2, 16, 128)


TOKEN_NAMES = ["1"] + [f"{b}+" for b in TOKEN_CLASSES[1:]]


def token_class(n_rows: int) -> str:
    """The size class of an op on ``n_rows`` rows (``1``, ``2+``, ``16+``, ``128+``)."""
    low = max(b for b in TOKEN_CLASSES if b <= max(n_rows, 1))
    return "1" if low == 1 else f"{low}+"


def threads_of(frames: Any) -> int:
    return int((frames.info.context or {}).get("n_threads") or 0)


def fit(sessions: Iterable[Any]) -> CostModel:
    """The cost model of the sessions' timed ops (``SessionFrames`` with ops)."""
    parts = []
    fusion = _Fusion()
    overhead_rows: list[tuple[Where, str, float]] = []
    sessions = list(sessions)
    graphs = [log_graphs(sf) if not sf.ops.empty else {} for sf in sessions]
    for sf, g in zip(sessions, graphs, strict=True):
        threads = threads_of(sf)
        df = _op_frame(sf, g, _devices_of(sf))
        if df is None or df.empty:
            continue
        df["threads"] = np.where(df["device"] == "CPU", threads, 0)
        parts.append(df)
        _fused_roles(sf, g, threads, fusion)
        # the host's time per compute outside the ops (on several devices: outside the devices'
        # own time and the copies, which split_costs prices): graph build, inputs, outputs
        per_step = df.groupby("step").agg(op_ns=("dur", "sum"), computes=("ubatch", "nunique"))
        on_devices = split_costs.device_time(sf)
        steps = sf.steps.set_index("step")
        took = net_costs.step_times(sf)
        for step, row in per_step.iterrows():
            if step not in steps.index:
                continue
            s = steps.loc[step]
            inside = on_devices.get(int(step), float(row["op_ns"]))
            extra = (took[int(step)] - inside) / max(int(row["computes"]), 1)
            overhead_rows.append((Where("CPU", threads), str(s["kind"]), max(extra, 0.0)))
    if not parts:
        return CostModel(fits={}, roofs={}, fused=set(), overhead={})
    obs = pd.concat(parts, ignore_index=True)
    obs["where"] = [Where(d, int(t)) for d, t in zip(obs["device"], obs["threads"], strict=True)]
    roofs = {w: _roofs(rows) for w, rows in obs.groupby("where", sort=False)}
    obs["work"] = 0.0
    for w, rows in obs.groupby("where", sort=False):
        obs.loc[rows.index, "work"] = roofs[w].work(
            rows["label"].tolist(),
            rows["type0"].tolist(),
            rows["bytes"].to_numpy(),
            rows["flops"].to_numpy(),
        )
    fits: dict[ClassKey, Fit] = {}
    # per role, and per op over all roles (for a node whose role no log has: another model)
    for by in (
        ["where", "tokens", "label", "type0", "role"],
        ["where", "tokens", "label", "type0"],
    ):
        for keys, rows in obs.groupby(by, sort=False):
            w = keys[0]
            key = (*keys, "") if len(keys) == 4 else keys
            fits[key] = _fit(rows["work"].to_numpy(), rows["dur"].to_numpy(), roofs[w].fixed)
    over: dict[tuple[Where, str], list[float]] = defaultdict(list)
    for w, kind, extra in overhead_rows:
        over[(w, kind)].append(extra)
    model = CostModel(
        fits=fits,
        roofs=roofs,
        fused=fusion.fused,
        timed=fusion.timed,
        fused_after=fusion.after_fused - fusion.after_timed,
        types_run={str(t) for t in obs["type0"].unique()},
        overhead={k: float(np.median(v)) for k, v in over.items()},
        splits=split_costs.fit(sessions),
    )
    _self_check(model, sessions, graphs)
    return model


def _self_check(model: CostModel, sessions: list[Any], graphs: list[LogGraphs]) -> None:
    """Per kind, each logged step's measured time against the model's price of it (its own
    graphs, its own overhead): how far the fit strays on the data it was fitted on."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    levels: dict[str, list[float]] = defaultdict(list)
    levels_on: dict[tuple[str, frozenset[str]], list[float]] = defaultdict(list)
    for sf, log_g in zip(sessions, graphs, strict=True):
        threads = threads_of(sf)
        if sf.ops.empty:
            continue
        priced: dict[tuple[int, str, bool], float] = {}
        computes = sf.ops[["step", "ubatch", "graph"]].drop_duplicates()
        # where the weights are held: as a graph of one token placed them (split_costs.holders)
        one = next((v for v in log_g.values() if v[0].graph.n_tokens == 1), None)
        held = split_costs.holders(one[0].graph, one[1]) if one is not None else None
        last = -1  # the graph of the previous compute (the same one is not sent again over RPC)
        steps = sf.steps.set_index("step")
        kinds = steps["kind"].astype(str)
        pred: dict[int, float] = defaultdict(float)
        used: dict[str, set[str]] = defaultdict(set)  # per kind, the devices its steps used
        for step, _ub, gid in computes.itertuples(index=False):
            kind = str(kinds.get(step, ""))
            resend, last = int(gid) != last, int(gid)
            if int(gid) not in log_g or kind not in ("prompt", "gen"):
                continue
            gc, devs = log_g[int(gid)]
            used[kind] |= {d for d, nop in zip(devs, gc.noop, strict=False) if not nop}
            key = (int(gid), kind, resend)
            if key not in priced:
                gc, devs = log_g[int(gid)]
                t, extra, missing, lost = model.price_compute(
                    gc, devs, threads, kind, resend, held if gc.graph.n_tokens > 1 else None
                )
                ok = not missing and not lost
                priced[key] = float(t.sum() + sum(extra.values())) if ok else np.nan
            p_graph = priced[key]
            pred[step] += p_graph + model.overhead.get((Where("CPU", threads), kind), 0.0)
        if pred and net_costs.is_rpc_log(sf):
            # the session's first step allocated its compute buffers on the servers
            pred[min(pred)] += model.splits.net.setup_ns()
        mine: dict[str, list[tuple[float, float]]] = defaultdict(list)
        took = net_costs.step_times(sf)
        for step, p in pred.items():
            if p > 0:
                mine[str(kinds[step])].append((took[int(step)], p))
        for kind, pairs in mine.items():
            out[kind] += pairs
            a = np.asarray(pairs)
            levels[kind].append(float(a[:, 0].sum() / a[:, 1].sum()))
            levels_on[(kind, frozenset(used[kind]))].append(levels[kind][-1])
    for kind, pairs in out.items():
        a = np.asarray(pairs)
        model.self_ratios[kind] = a[:, 0] / a[:, 1]
        model.self_level[kind] = float(np.median(levels[kind]))
    model.self_level_on = {k: float(np.median(v)) for k, v in levels_on.items()}
