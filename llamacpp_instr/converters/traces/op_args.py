"""An op slice's args, the same in every writer: what does not depend on its timing
(``op_static_args``, once per graph node in the bulk writers, ``OpVariants``), its rates
(``op_rates``, and over a compute's columns ``op_rates_bulk``) and all of them (``op_args``);
and the rate of a device copy or an RPC command (``mb_per_s``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..reading.decode.computes import Compute, OpTiming
from ..reading.decode.graphs import Graph, Node
from ..session import derive
from ..session.machine_peaks import Roof
from .rounding import EXACT, round3


def mb_per_s(nbytes: int, ns: int) -> float:
    """``round(nbytes * 1e9 / ns / 1e6, 3)`` (``device_time.bandwidth`` in MB/s, as a copy's
    or a transfer's args show it), 0.0 without a time; exactly Python's ``round``, cheaper (a
    dozen a step). As ``rounding.round3`` argues for arrays: ``0 <= p < 2**43`` bounds the
    product's error by ``2**-11``, so within 0.49 of the nearest integer ``r`` the exact product
    is within 0.5 of ``r`` too, and ``r / 1000`` (one correctly rounded division) is Python's
    result; anything else Python rounds itself. ``r`` is made by adding and taking away
    ``rounding.ROUNDER``: the sum lies in ``[2**52, 2**53)``, where the doubles are the
    integers, so it rounds ``p`` to the nearest, ties to even, as ``round`` does, and the
    difference is exact."""
    if ns > 0:
        x = nbytes * 1e9 / ns / 1e6
        p = x * 1000.0
        if 0.0 <= p < 8.0e12:  # (8e12 < 2**43)
            r = p + 6755399441055744.0 - 6755399441055744.0  # (ROUNDER: a constant, not a name)
            if -0.49 < p - r < 0.49:
                return r / 1000.0
        return round(x, 3)
    return 0.0


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _source_text(src: dict[str, Any], graph_nodes: list[Any]) -> str:
    if "node" in src:
        n = graph_nodes[src["node"]]
        return f"{n.name} {n.dtype} {_shape(n.shape)}"
    return f"{src['name']} {src['type']} {_shape(src['shape'])} ({src['kind']})"


def op_static_args(
    node: Node, fused: list[Node], graph: Graph, roof: Roof | None = None
) -> tuple[dict[str, Any], int, int, dict[str, Any], float | None]:
    """What an op's args say that does not depend on its timing: ``(head, flops, bytes, tail,
    ideal)``.

    An op's args are ``head``, then its rates (``op_rates``: ``gflop_per_s`` and ``gb_per_s``,
    ``flops`` and ``bytes`` over its duration, and with a ``roof``, ``roof_fraction``: ``ideal``,
    its least time at the roofs, over its duration), then ``tail``, then its tensor stats if any
    (see ``op_args``). ``tail`` holds the roofline's intensity (FLOPs per byte) and, with a
    roof, the one that binds it (``bound``: memory or compute). A graph node's static args
    repeat every step, so bulk writers compute them once per node.
    """
    n_flops = derive.flops(node, graph) + sum(derive.flops(f, graph) for f in fused)
    n_bytes = derive.bytes_moved(node, graph) + sum(derive.bytes_moved(f, graph) for f in fused)
    head: dict[str, Any] = {
        "op": node.label,
        "node": node.name,
        "node_index": node.i,
        "graph": graph.id,
        "layer": node.layer if node.layer is not None else "none",
        "shape": _shape(node.shape),
        "dtype": node.dtype,
        "bytes": node.bytes,
        "sources": "; ".join(_source_text(s, graph.nodes) for s in node.src),
        "category": derive.category(node),
        "est_flops": n_flops,
        "est_bytes_moved": n_bytes,
    }
    # the roofline's x (roofline.py): FLOPs per byte moved
    tail: dict[str, Any] = {"intensity": round(n_flops / n_bytes, 3) if n_bytes else 0.0}
    w = derive.weight_source(node)
    ideal = None
    if roof is not None:
        ideal, tail["bound"] = roof.ideal(n_flops, n_bytes, node.op, w["type"] if w else None)
    if w is not None:
        tail["weight"] = w["name"]
        tail["weight_type"] = w["type"]
    if fused:
        tail["fused"] = ", ".join(f"{f.name} ({f.label})" for f in fused)
    if node.flags:
        tail["flags"] = ",".join(node.flags)
    return head, n_flops, n_bytes, tail, ideal


class OpVariants:
    """The Chrome writer's id for each op variant of one graph (a node, or a node with the nodes
    fused into it), made on first use by ``build`` (a list of variants, each a node index and
    the indices fused into it: their ids, in order), all of a compute's new ones at once. ``ids``
    gives a packed compute's ops theirs; a generation step repeats its graph's last compute (the
    same node order and fused ops), whose ids come back as they are. (The Perfetto writer makes
    rows only for the ops a device's part keeps, ``perfetto.ops.NodeTable``, but its statics in
    this order: ``StaticSet.prime``.)"""

    def __init__(
        self, n_nodes: int, build: Callable[[list[tuple[int, tuple[int, ...]]]], list[int]]
    ) -> None:
        self.build = build
        self.node_id = np.full(n_nodes, -1, dtype=np.int64)
        self.fused_id: dict[tuple[int, tuple[int, ...]], int] = {}
        # the last compute's fused ops, node indices (as bytes) and ids
        self.last: tuple[dict[int, list[int]], bytes, np.ndarray] | None = None

    def ids(self, node: np.ndarray, fused: dict[int, list[int]]) -> np.ndarray:
        """The id of each op: ``node`` its node indices (int64), ``fused`` the fused nodes by op
        position. The result is shared: callers do not change it. New variants are built plain
        nodes first (by index), then fused ones (by op position)."""
        key = node.tobytes()
        last = self.last
        if last is not None and (last[0] is fused or last[0] == fused) and last[1] == key:
            return last[2]
        ids = self.node_id[node]
        if (ids < 0).any():
            new = sorted(set(node[ids < 0].tolist()))  # (np.unique would import numpy.ma)
            self.node_id[new] = self.build([(i, ()) for i in new])
            ids = self.node_id[node]
        if fused:
            ids = ids.copy()
            nodes = node.tolist()
            variants = [(nodes[k], tuple(f)) for k, f in fused.items()]
            known = self.fused_id
            todo = [v for v in dict.fromkeys(variants) if v not in known]
            if todo:
                known.update(zip(todo, self.build(todo), strict=True))
            ids[list(fused)] = [known[v] for v in variants]
        self.last = (fused, key, ids)
        return ids


RATE_NAMES = ("gflop_per_s", "gb_per_s", "roof_fraction")  # the args ``op_rates`` gives


def op_rates(n_flops: int, n_bytes: int, dur: int, ideal: float | None = None) -> tuple[float, ...]:
    """An op's rates as the args show them (``RATE_NAMES``): ``(gflop_per_s, gb_per_s)``, and
    with a roof's ``ideal`` time, its ``roof_fraction`` (0 without a duration, like the rates)."""
    rates = (
        round(derive.gflops_per_s(n_flops, dur), 3),
        round(derive.gbytes_per_s(n_bytes, dur), 3),
    )
    if ideal is None:
        return rates
    return (*rates, round(ideal / dur, 3) if dur > 0 else 0.0)


def op_rates_bulk(
    flops: np.ndarray,
    nbytes: np.ndarray,
    exact: np.ndarray,
    dur: np.ndarray,
    ideal: np.ndarray | None,
    roofed: np.ndarray,
    one: Callable[[int], tuple[float, ...]],
) -> list[np.ndarray]:
    """``op_rates`` of many ops at once, for the bulk writers: GFLOP/s, GB/s and, if ``ideal`` is
    given (the ops' least times, where ``roofed``), a third array, the roof fraction. ``flops``
    and ``nbytes`` as floats, ``exact`` where they are exact; where numpy cannot be sure of
    Python's rounding (``rounding.round3``), ``one(k)`` gives op k's rates as ``op_rates`` does."""
    pos = dur > 0
    d = np.where(pos, dur, 1).astype(np.float64)
    rates = [round3(np.where(pos, flops / d, 0.0)), round3(np.where(pos, nbytes / d, 0.0))]
    bad = np.isnan(rates[0]) | np.isnan(rates[1]) | ~exact | (dur > EXACT)
    if ideal is not None:
        rates.append(round3(np.where(pos, ideal / d, 0.0)))
        bad |= roofed & np.isnan(rates[2])
    for k in np.flatnonzero(bad).tolist():
        for j, v in enumerate(one(k)):
            rates[j][k] = v
    return rates


def op_args(op: OpTiming, compute: Compute, roof: Roof | None = None) -> dict[str, Any]:
    graph = compute.graph
    assert graph is not None
    args, n_flops, n_bytes, tail, ideal = op_static_args(op.node, op.fused, graph, roof)
    args.update(zip(RATE_NAMES, op_rates(n_flops, n_bytes, op.dur, ideal), strict=False))
    args.update(tail)
    if op.stats is not None:
        mn, mx, mean, std, n_nan, n_inf = op.stats
        args.update(
            {
                "out_min": mn,
                "out_max": mx,
                "out_mean": mean,
                "out_std": std,
                "out_nan": n_nan,
                "out_inf": n_inf,
            }
        )
    return args
