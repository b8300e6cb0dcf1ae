"""What running on several devices cost in measured runs, beyond the ops: what ``instr predict``
adds to a setting whose graph ggml's scheduler splits across devices.

A compute on several devices is priced as the sum, over its splits, of the split's ops on its
device and the split's time beyond its ops, plus the copies between devices, plus the host's own
time (``op_costs``' overhead). Each from a log's device tables (``frames_devices``):

- **A split's time beyond its ops:** each device's time in the step (``held_ns``: the CPU's split
  from launch to end; a GPU's from handing it each split until it was done, ``outstanding_ns``,
  its busy time by its own clock and the latency of its submissions, which the host waits out)
  less the ops it timed, per split; per device and kind of step, the median over the logs'
  steps.
- **A copy between devices:** each input the scheduler copied to a split's device, timed on the
  host, fitted per link (source and destination device) as ``fixed + bytes * per_byte`` by least
  squares, or, from one size, scaled from it.

A target graph's splits are the runs of its nodes on one device, in order (the device of each
node is the scheduler's own, from ``llama_instr_graph_reserve``); a split's copies, each tensor
it reads once that another device made: a node's output, or an input (made on the CPU); and each
weight held on another device than the node reading it (``held``): ggml's op offload, which runs
a matmul of a large batch (32 tokens or more on Vulkan) on the GPU though its weights are on the
host, copying them over for each ubatch (at -ngl 0 every layer's, for the prompt). Such a node
starts a split of its own, as ggml's scheduler makes one (so that the memory of the weights
copied before it can be reused). Where a weight is held is where the graph of one token runs its
node (``holders``): no op is offloaded for one token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.converters.reading.decode.graphs import Graph
from llamacpp_instr.deciding.prediction import net_costs

# (node name, weight name) -> the device holding that weight
Holders = dict[tuple[str, str], str]


@dataclass
class Link:
    """A copy's host time over one link: ``fixed + per_byte * bytes`` (ns)."""

    fixed: float
    per_byte: float
    n: int

    def time(self, n_bytes: float) -> float:
        return self.fixed + self.per_byte * n_bytes


@dataclass
class SplitCosts:
    """Per (device, kind): a split's time beyond its ops; per (source, destination): a copy's."""

    extra: dict[tuple[str, str], float] = field(default_factory=dict)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    # the RPC devices' links
    net: net_costs.NetCosts = field(default_factory=net_costs.NetCosts)


def _link(sizes: np.ndarray, durs: np.ndarray) -> Link:
    if len(np.unique(sizes)) >= 2:
        slope, intercept = np.polyfit(sizes.astype(np.float64), durs.astype(np.float64), 1)
        if slope > 0 and intercept >= 0:
            return Link(fixed=float(intercept), per_byte=float(slope), n=len(sizes))
    fixed = float(np.min(durs))
    mean_b = float(np.mean(sizes))
    per_byte = max(float(np.mean(durs)) - fixed, 0.0) / mean_b if mean_b > 0 else 0.0
    return Link(fixed=fixed, per_byte=per_byte, n=len(sizes))


def held_ns(row: Any) -> float:
    """A device's time in a step (a ``device_steps`` row): its own compute, and for a GPU (not an
    RPC server, whose outstanding time holds the network) the time it held the host waiting on
    splits it had not started or had done (``outstanding_ns``: submission latency)."""
    compute = float(row.compute_ns)
    if str(row.device) == "CPU" or str(row.device).startswith("RPC"):
        return compute
    return max(compute, float(getattr(row, "outstanding_ns", 0.0) or 0.0))


def several_devices(sf: Any) -> bool:
    ds = getattr(sf, "device_steps", None)
    return ds is not None and not ds.empty and getattr(sf, "splits", None) is not None


def fit(sessions: Iterable[Any]) -> SplitCosts:
    """The split and copy costs of the sessions that ran on several devices."""
    sessions = list(sessions)
    extras: dict[tuple[str, str], list[float]] = defaultdict(list)
    copies: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for sf in sessions:
        if not several_devices(sf):
            continue
        n_splits = sf.splits.groupby(["step", "device"], observed=True).size()
        for row in sf.device_steps[sf.device_steps["step"] >= 0].itertuples(index=False):
            n = int(n_splits.get((row.step, row.device), 0))
            if n and row.timed:
                extra = (held_ns(row) - float(row.op_ns)) / n
                extras[(str(row.device), str(row.kind))].append(max(extra, 0.0))
        cp = sf.copies
        if cp is not None and not cp.empty:
            for (src, dst), rows in cp.groupby(["src", "dst"], sort=False, observed=True):
                b, d = copies[(str(src), str(dst))]
                b += rows["bytes"].astype(float).tolist()
                d += rows["dur_ns"].astype(float).tolist()
    out = SplitCosts()
    out.extra = {k: float(np.median(v)) for k, v in extras.items() if v}
    out.links = {k: _link(np.asarray(b), np.asarray(d)) for k, (b, d) in copies.items() if b}
    out.net = net_costs.fit(sessions)
    return out


def device_time(sf: Any) -> dict[int, float]:
    """Per step, the time its devices took (each by its own measure) and its copies: the part of
    the step that is not the host's own work."""
    if not several_devices(sf):
        return {}
    if net_costs.is_rpc_log(sf):
        # the step's window less the host's own part: its devices' compute and the network's
        # time while none computed (``token_time``)
        tt = sf.token_time[sf.token_time["step"].notna()]
        inside = tt["token_ns"].astype(float) - tt["host_ns"].astype(float)
        return {int(s): float(v) for s, v in zip(tt["step"], inside, strict=True)}
    ds = sf.device_steps[sf.device_steps["step"] >= 0]
    out: dict[Any, float] = defaultdict(float)
    for row in ds.itertuples(index=False):
        out[row.step] += held_ns(row)
    cp = sf.copies
    if cp is not None and not cp.empty:
        for step, v in cp.groupby("step")["dur_ns"].sum().items():
            out[step] = out.get(step, 0.0) + float(v)
    return {int(k): float(v) for k, v in out.items()}


def node_devices(sf: Any, step: int, ubatch: int, n_nodes: int) -> list[str]:
    """The device of each node of the graph a log's compute (step, ubatch) ran: the split holding
    it (all the CPU's without splits)."""
    device = ["CPU"] * n_nodes
    splits = getattr(sf, "splits", None)
    if splits is None or splits.empty:
        return device
    for row in splits[(splits["step"] == step) & (splits["ubatch"] == ubatch)].itertuples():
        for i in range(max(int(row.node_start), 0), min(int(row.node_end), n_nodes)):
            device[i] = str(row.device)
    return device


def holders(g: Graph, devs: Sequence[str]) -> Holders:
    """Where each weight a graph's nodes read is held: the device of the node reading it, in a
    graph of one token (where ggml offloads no op: module docstring)."""
    out: Holders = {}
    for node in g.nodes:
        for s in node.src:
            if s.get("kind") == "weight" and node.i < len(devs):
                out[(node.name, str(s.get("name")))] = devs[node.i] or "CPU"
    return out


def offloaded_weights(g: Graph, devs: Sequence[str], held: Holders) -> set[str]:
    """The weights a graph copies to run a node where they are not held (ggml's op offload)."""
    return {
        str(s.get("name"))
        for node in g.nodes
        if node.i < len(devs) and "noop" not in node.flags
        for s in node.src
        if s.get("kind") == "weight"
        and held.get((node.name, str(s.get("name"))), devs[node.i]) != devs[node.i]
    }


def _root(g: Graph, j: int) -> int:
    """The node a view's data is: through views and reshapes (``noop`` nodes) to the node that
    computed it, or -1 where it is a leaf (a weight, an input, the KV cache)."""
    for _ in range(len(g.nodes)):
        if "noop" not in g.nodes[j].flags:
            return j
        src = g.nodes[j].src[0] if g.nodes[j].src else {}
        if "node" not in src:
            return -1
        j = int(src["node"])
    return j


def across_devices(
    g: Graph,
    noop: Sequence[bool] | np.ndarray,
    devs: Sequence[str],
    costs: SplitCosts,
    kind: str,
    resend: bool = True,
    held: Holders | None = None,
    shares: dict[int, float] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """A graph split across devices: the time of its splits beyond their ops, per device, of the
    copies into them (under ``copies``: with the weights ``held`` on another device) and of the
    commands sent to RPC servers (under ``network``: ``net_costs``; ``resend``: the graph is not
    the one the previous compute ran, so each server is sent it whole); and what no log has
    (module docstring). ``shares``: per expert matmul (node index), the share of its experts
    ggml copies where it offloads the op (the experts used: ``expert_traffic``)."""
    walk = _Walk(g, noop, devs, costs, held, shares)
    k0 = 0
    while k0 < len(walk.run):
        k0 = walk.split(k0, kind, resend)
    # the program reads the logits (the graph's output) from the device that made them
    out = _output(g, noop)
    if out is not None and devs[out].startswith("RPC"):
        walk.read_back(devs[out], g.nodes[out].bytes)
    return dict(walk.extra), sorted(set(walk.lost))


class _Walk:
    """``across_devices``' walk over a graph's splits: the time it adds up and what no log has."""

    def __init__(
        self,
        g: Graph,
        noop: Sequence[bool] | np.ndarray,
        devs: Sequence[str],
        costs: SplitCosts,
        held: Holders | None,
        shares: dict[int, float] | None,
    ) -> None:
        self.g, self.devs, self.costs, self.held, self.shares = g, devs, costs, held, shares
        self.extra: dict[str, float] = defaultdict(float)
        self.lost: list[str] = []
        self.run = [k for k in range(len(g.nodes)) if not noop[k]]
        self.by_name = {g.nodes[k].name: k for k in self.run}

    def link(self, dev: str) -> net_costs.Link | None:
        found = self.costs.net.link(dev)
        if found is None:
            self.lost.append(
                f"the network to {dev}: no log measured its link (an RPC run's log has it, or "
                "give --rpc-rate and --rpc-rtt)"
            )
        return found

    def read_back(self, dev: str, n_bytes: int) -> None:
        """A get_tensor from an RPC device: one round trip and the bytes."""
        lk = self.link(dev)
        if lk is not None:
            self.extra["network"] += lk.time(net_costs.GET_SENT + n_bytes + net_costs.GET_FRAME, 1)

    def inputs(self, k: int, dev: str) -> dict[str, tuple[str, int]]:
        """What node ``k`` on ``dev`` reads from another device: name -> (device, bytes)."""
        g, devs, held = self.g, self.devs, self.held
        node = g.nodes[k]
        out: dict[str, tuple[str, int]] = {}
        for s in node.src:
            if "node" in s:
                j = _root(g, int(s["node"]))
                if j >= 0 and devs[j] != dev:
                    out[g.nodes[j].name] = (devs[j], g.nodes[j].bytes)
            elif s.get("kind") == "input" and dev != "CPU":
                out[str(s.get("name"))] = ("CPU", int(s.get("bytes", 0)))
            elif s.get("kind") == "weight" and held:
                where = held.get((node.name, str(s.get("name"))), dev)
                if where != dev:
                    share = (self.shares or {}).get(k, 1.0) if s is node.src[0] else 1.0
                    out[str(s.get("name"))] = (where, int(int(s.get("bytes", 0)) * share))
            elif dev != "CPU" and s.get("kind") == "other" and "#" in str(s.get("name")):
                # the scheduler's copy onto this device (DEV[...]#inp_pos#0): of another
                # device's node, or of an input llama.cpp set on the host (positions, mask)
                base = str(s.get("name")).split("#")[1]
                j = self.by_name.get(base, -1)
                src_dev = devs[j] if j >= 0 else "CPU"
                if src_dev != dev:
                    out[base] = (src_dev, int(s.get("bytes", 0)))
        return out

    def offloaded(self, k: int, dev: str) -> bool:
        """Node ``k`` reads a weight held on another device (ggml's op offload)."""
        return bool(self.held) and any(
            s.get("kind") == "weight"
            and (self.held or {}).get((self.g.nodes[k].name, str(s.get("name"))), dev) != dev
            for s in self.g.nodes[k].src
        )

    def split(self, k0: int, kind: str, resend: bool) -> int:
        """The split that starts at ``run[k0]`` priced; the index its next starts at."""
        run, devs, costs = self.run, self.devs, self.costs
        dev = devs[run[k0]]
        rpc = dev.startswith("RPC")
        copied: dict[str, tuple[str, int]] = {}
        k1 = k0
        while k1 < len(run) and devs[run[k1]] == dev:
            # the scheduler starts a split at a node reading a weight it copies, once the split
            # has inputs (module docstring)
            if k1 > k0 and copied and self.offloaded(run[k1], dev):
                break
            copied.update(self.inputs(run[k1], dev))
            k1 += 1
        split_extra = costs.extra.get((dev, kind))
        if split_extra is None:
            self.lost.append(f"a split on {dev} in {kind} steps: no log ran one")
        else:
            self.extra[dev] += split_extra
        for src_dev, n_bytes in copied.values():
            self.copy(src_dev, dev, n_bytes)
        if rpc:
            lk = self.link(dev)
            if lk is not None:
                # the graph the server already holds is computed again (graph_recompute)
                n_nodes = run[k1 - 1] - run[k0] + 1
                sent = costs.net.node_bytes * n_nodes if resend else net_costs.RECOMPUTE_SENT
                self.extra["network"] += lk.time(sent)
        return k1

    def copy(self, src_dev: str, dev: str, n_bytes: int) -> None:
        """A split's input copied from ``src_dev`` onto ``dev``."""
        if src_dev.startswith("RPC"):
            self.read_back(src_dev, n_bytes)  # read from its server, then sent on (below)
        if dev.startswith("RPC"):
            lk = self.link(dev)
            if lk is not None:
                self.extra["network"] += lk.time(net_costs.SET_FRAME + n_bytes)
            return
        if src_dev.startswith("RPC"):
            return
        cp = self.costs.links.get((src_dev, dev))
        if cp is None:
            self.lost.append(f"copies from {src_dev} to {dev}: no log made one")
        else:
            self.extra["copies"] += cp.time(n_bytes)


def _output(g: Graph, noop: Sequence[bool] | np.ndarray) -> int | None:
    """The node whose values the program reads after the compute: ``result_output`` (the
    logits), else the graph's last node that runs."""
    for k in range(len(g.nodes) - 1, -1, -1):
        if g.nodes[k].name == "result_output":
            return k
    run = [k for k in range(len(g.nodes)) if not noop[k]]
    return run[-1] if run else None
