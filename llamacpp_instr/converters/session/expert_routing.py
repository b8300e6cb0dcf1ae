"""A mixture of experts' routing as the log records it (``experts`` records): per
compute, layer and expert, the tokens the router sent there and the sum of their routing weights
(the router's probabilities of the chosen entries; ``None`` where the log could not read them).

Decoded with bounds (``MAX_EXPERTS``, ``MAX_LAYERS``): a record outside them is malformed. A log
without such records (a dense model, MINIMAL, a router whose ids the log cannot read: another
architecture's, one on an RPC server) has no routing: the readers say which, in one line
(``no_routing``), and nothing is guessed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# the native side's bounds (src/llama-instr-experts.cpp)
MAX_EXPERTS = 65536
MAX_LAYERS = 4096

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


@dataclass
class Routing:
    """One compute's routing: ``rows`` of (layer, expert, tokens, weight or None); ``tokens``
    (VERBOSE) per layer (layer, n_used, expert ids token by token, their weights)."""

    ubatch: int
    n_expert: int
    n_layer: int
    rows: list[tuple[int, int, int, float | None]] = field(default_factory=list)
    tokens: list[tuple[int, int, list[int], list[float | None]]] = field(default_factory=list)


def _uint(v: Any, bound: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < bound:
        raise ValueError(f"{what} {v!r} is not an integer in [0, {bound})")
    return v


def _weight(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"weight {v!r} is not a number")
    return float(v)


def routing(rec: dict[str, Any]) -> Routing:
    """An ``experts`` record, checked against its bounds (raises ``ValueError`` and the like,
    ``decode.fields.MALFORMED``, for one outside them)."""
    n_expert = _uint(rec["n_expert"], MAX_EXPERTS + 1, "n_expert")
    n_layer = _uint(rec["n_layer"], MAX_LAYERS + 1, "n_layer")
    out = Routing(_uint(rec["ubatch"], 1 << 31, "ubatch"), n_expert, n_layer)
    for row in rec["rows"]:
        if not isinstance(row, list) or len(row) != 4:
            raise ValueError("an experts row is not [layer, expert, tokens, weight]")
        out.rows.append(
            (
                _uint(row[0], n_layer, "layer"),
                _uint(row[1], n_expert, "expert"),
                _uint(row[2], 1 << 31, "tokens"),
                _weight(row[3]),
            )
        )
    for blk in rec.get("tokens") or []:
        if not isinstance(blk, list) or len(blk) != 4:
            raise ValueError("an experts tokens entry is not [layer, n_used, ids, weights]")
        layer = _uint(blk[0], n_layer, "layer")
        n_used = _uint(blk[1], n_expert + 1, "n_used")
        ids = [_uint(e, n_expert, "expert") for e in blk[2]]
        ws = [_weight(w) for w in blk[3]]
        if len(ids) != len(ws) or (n_used and len(ids) % n_used):
            raise ValueError("an experts tokens entry's ids and weights do not pair up")
        out.tokens.append((layer, n_used, ids, ws))
    return out
