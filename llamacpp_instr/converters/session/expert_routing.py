"""A mixture of experts' routing as the log records it (``experts`` records): per compute, layer
and expert, the tokens the router sent there and the sum of their routing weights (the router's
probabilities of the chosen entries; NaN where the log could not read them).

Each record is bounded by what its compute's graph allows, the graph the log wrote for that
compute: a row's layer is one whose router (the ARGSORT node ``ffn_moe_argsort-<il>``, the ranking
the native side reads) is in the graph, its expert is below that router's experts, its tokens at
most the rows the router ranked, and each (layer, expert) comes once; the record's ``n_expert`` is
the routers', its ``n_layer`` the context's model's where the log says it; one record a compute.
So a record holds at most (routers x experts) rows. A graph's routers times their experts, and a
session's layers with routing times its experts, are at most ``ROUTING_CELLS``: the cells of the
per-layer tables the readers make. A record outside these bounds is malformed and skipped.

A log without such records (a dense model, MINIMAL, a router whose ids the log cannot read:
another architecture's, one on an RPC server) has no routing: the readers say which, in one line
(``no_routing``), and nothing is guessed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..reading.decode.graphs import Graph

# the native side's bounds (src/llama-instr-experts.cpp)
MAX_EXPERTS = 65536
MAX_LAYERS = 4096

# a graph's routers times their experts, and a session's layers with routing times its experts,
# at most: the cells of the per-layer tables a reader makes of them (over twice those of the
# largest models: 94 layers of 128 experts, 61 of 384, 48 of 512)
ROUTING_CELLS = 1 << 17
TOKENS_MAX = (1 << 31) - 1  # a row's tokens, at most (the native side's counts are int32)

# the router's ranking, as llama.cpp names it and the native side reads it
ROUTER = re.compile(r"ffn_moe_argsort-(\d+)")

# why a log has no routing, in one line each (``no_routing``)
NO_ROUTING = {
    "dense": "no routing in {log}: its model has no experts (no ffn_*_exps tensors)",
    "minimal": (
        "no routing in {log}: recorded at --level {level}; a mixture of experts' routing is "
        "recorded at --level detailed"
    ),
    "unread": (
        "no routing in {log}: its model is a mixture of experts ({n} expert tensors), but the "
        "log read none of its routers (llama.cpp's ranking ffn_moe_argsort-N, read on the CPU "
        "and on Vulkan; another architecture's router, or one on an RPC server, is not): none "
        "is guessed"
    ),
}


def no_routing(log: object, level: str, n_expert_tensors: int) -> str:
    """The one line that says why a log has no routing records: a dense model, a level below
    DETAILED, or a mixture of experts whose routers the log could not read."""
    if n_expert_tensors == 0:
        return NO_ROUTING["dense"].format(log=log)
    if level not in ("detailed", "verbose"):
        return NO_ROUTING["minimal"].format(log=log, level=level or "?")
    return NO_ROUTING["unread"].format(log=log, n=n_expert_tensors)


@dataclass(frozen=True)
class Router:
    """One layer's router in a graph: its experts, and the rows (tokens) it ranked."""

    n_expert: int
    n_rows: int


def routers(g: Graph) -> dict[int, Router]:
    """A graph's routers by layer: its ARGSORT nodes ``ffn_moe_argsort-<il>`` of a 2-D shape
    (experts, rows), as the native side reads them ({} for a graph without)."""
    out: dict[int, Router] = {}
    for n in g.nodes:
        if n.op != "ARGSORT":
            continue
        m = ROUTER.fullmatch(n.name)
        shape = n.shape + [1] * (2 - len(n.shape))
        if m is None or len(shape) != 2 or not 2 <= shape[0] <= MAX_EXPERTS:
            continue
        il = int(m.group(1))
        if il < MAX_LAYERS:
            out[il] = Router(shape[0], shape[1])
    return out


@dataclass
class Routing:
    """One compute's routing: ``rows`` (n, 3) int32 of (layer, expert, tokens) and ``weight``
    (n,) float64 (NaN: not read); ``tokens`` (VERBOSE) per layer (layer, n_used, expert ids token
    by token as an int32 array, their weights as a float64 array, NaN: not read)."""

    ubatch: int
    n_expert: int
    n_layer: int
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int32))
    weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tokens: list[tuple[int, int, np.ndarray, np.ndarray]] = field(default_factory=list)

    def used(self) -> dict[int, int]:
        """Per layer, the experts that got at least one token."""
        got = self.rows[self.rows[:, 2] > 0]
        layers, counts = np.unique(got[:, 0], return_counts=True)
        return dict(zip(layers.tolist(), counts.tolist(), strict=True))


def _uint(v: Any, bound: int, what: str) -> int:
    if type(v) is not int or not 0 <= v < bound:
        raise ValueError(f"{what} {v!r} is not an integer in [0, {bound})")
    return v


def _ints(col: Any, bound: Any, what: str) -> np.ndarray:
    """A column of JSON integers (an object array or a list), each in [0, ``bound``) (an int,
    or an array of per-row bounds), as int64; else ValueError."""
    if not set(map(type, col)) <= {int}:
        raise ValueError(f"a {what} that is not an integer")
    try:
        v = np.asarray(col, dtype=object).astype(np.int64)
    except OverflowError:
        raise ValueError(f"a {what} beyond 64 bits") from None
    if len(v) and (v.min() < 0 or (v >= bound).any()):
        raise ValueError(f"a {what} out of [0, {bound})" if isinstance(bound, int) else what)
    return v


def _weights(col: Any) -> np.ndarray:
    """A column of weights (JSON numbers or null) as float64, NaN for null; else ValueError."""
    if not set(map(type, col)) <= {int, float, type(None)}:
        raise ValueError("a weight that is not a number")
    w = np.asarray(col, dtype=object)
    null = w == None  # noqa: E711 - elementwise, over the objects
    w = np.where(null, 0.0, w).astype(np.float64)
    if not np.isfinite(w).all():
        raise ValueError("a weight that is not finite")
    w[null] = math.nan
    return w


def _table(raw: Any, width: int, what: str) -> np.ndarray:
    """A record's list of rows of ``width`` values as an object array (n, width); else
    ValueError."""
    if type(raw) is not list:
        raise ValueError(f"{what} is not a list")
    if not raw:
        return np.zeros((0, width), object)
    a = np.array(raw, dtype=object)
    if a.ndim != 2 or a.shape[1] != width or not set(map(type, raw)) <= {list}:
        raise ValueError(f"an {what} row is not a list of {width} values")
    return a


def routing(
    rec: dict[str, Any], graph: Graph | None, by_layer: dict[int, Router], n_layer: int | None
) -> Routing:
    """An ``experts`` record, checked against its compute's graph (``graph``, its routers
    ``by_layer``) and the context's model's layers (``n_layer``; None where the log does not say
    them): raises ``ValueError`` and the like (``decode.fields.MALFORMED``) for one outside them,
    before reading more rows than they allow."""
    if graph is None or not by_layer:
        raise ValueError("an experts record of a compute whose graph has no router the log holds")
    if rec["graph"] != graph.id:
        raise ValueError(f"an experts record of graph {rec['graph']!r} for a compute of {graph.id}")
    n_expert = _uint(rec["n_expert"], MAX_EXPERTS + 1, "n_expert")
    layers = _uint(rec["n_layer"], MAX_LAYERS + 1, "n_layer")
    if any(r.n_expert != n_expert for r in by_layer.values()):
        raise ValueError(f"n_expert {n_expert} is not the graph's routers' experts")
    if len(by_layer) * n_expert > ROUTING_CELLS:
        raise ValueError(
            f"{len(by_layer)} routers of {n_expert} experts: more than {ROUTING_CELLS}"
        )
    if (n_layer is not None and layers != n_layer) or max(by_layer) >= layers:
        raise ValueError(f"n_layer {layers} is not the model's")
    out = Routing(_uint(rec["ubatch"], 1 << 31, "ubatch"), n_expert, layers)
    raw = rec["rows"]
    if type(raw) is not list or len(raw) > len(by_layer) * n_expert:
        raise ValueError(f"more experts rows than the graph's {len(by_layer)} routers allow")
    a = _table(raw, 4, "experts")
    # each layer's rows ranked: -1 for a layer without a router in the graph
    ranked = np.full(max(by_layer) + 1, -1, np.int64)
    for il, r in by_layer.items():
        ranked[il] = min(r.n_rows, TOKENS_MAX)
    layer = _ints(a[:, 0], len(ranked), "layer")
    expert = _ints(a[:, 1], n_expert, "expert")
    if (ranked[layer] < 0).any():
        raise ValueError("an experts row of a layer without a router in the graph")
    tokens = _ints(a[:, 2], ranked[layer] + 1, "row's tokens beyond the rows its router ranked")
    keys = np.sort(layer * n_expert + expert)
    if (keys[1:] == keys[:-1]).any():
        raise ValueError("an experts record names a layer's expert twice")
    out.rows = np.stack([layer, expert, tokens], axis=1).astype(np.int32)
    out.weight = _weights(a[:, 3])
    blocks = rec.get("tokens") or []
    if type(blocks) is not list or len(blocks) > len(by_layer):
        raise ValueError("more experts tokens entries than the graph's routers")
    seen: set[int] = set()
    for blk in blocks:
        if type(blk) is not list or len(blk) != 4:
            raise ValueError("an experts tokens entry is not [layer, n_used, ids, weights]")
        il, n_used, ids, ws = blk
        router = by_layer.get(il) if type(il) is int else None
        if router is None or il in seen:
            raise ValueError(f"a tokens entry of layer {il!r}: none or a second router")
        seen.add(il)
        n_used = _uint(n_used, n_expert + 1, "n_used")
        if (
            type(ids) is not list
            or type(ws) is not list
            or len(ids) != len(ws)
            or len(ids) > router.n_rows * n_used
            or (n_used and len(ids) % n_used)
            or (not n_used and ids)
        ):
            raise ValueError("an experts tokens entry's ids and weights do not pair up")
        ids_arr = _ints(ids, n_expert, "expert").astype(np.int32)
        out.tokens.append((il, n_used, ids_arr, _weights(ws)))
    return out
