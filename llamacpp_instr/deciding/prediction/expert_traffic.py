"""A mixture of experts' measured traffic, for ``instr predict`` and ``plan``: the
share of a layer's experts a compute touched, by layer and size class (``op_costs.token_class`` of
its tokens), from the logs' routing (``SessionFrames.experts``).

An expert matmul (MUL_MAT_ID) reads the experts its ubatch routed to, not the whole tensor: the
logs' ops carry those bytes (``ops.expert_bytes`` "routed"), which the fit takes, and a graph that
has not run is priced at the share its layer's computes of that size touched in the logs, as is
ggml's copy of the routed experts to a device that runs the matmul where its weights are not held
(op offload). A layer and size no log routed keeps the whole tensor, in the fit as in the price:
nothing is guessed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session import derive
from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, token_class


def _tokens(shape: str) -> tuple[int, str]:
    """A MUL_MAT_ID's tokens from its shape string (``rows x experts used x tokens``; a
    trailing 1 left out) and their size class."""
    dims = [int(x) for x in str(shape).split("x") if x.isdigit()]
    n = dims[2] if len(dims) >= 3 else 1
    return n, token_class(n)


def layer_of(node: Node) -> int | None:
    """A node's layer from its name (``ffn_moe_gate-12`` -> 12)."""
    head, _, tail = node.name.rpartition("-")
    return int(tail) if head and tail.isdigit() else None


@dataclass
class ExpertTraffic:
    """Per (layer, size class): the mean share of the layer's experts a compute routed to."""

    share: dict[tuple[int, str], float] = field(default_factory=dict)
    n: dict[tuple[int, str], int] = field(default_factory=dict)  # computes measured

    def __bool__(self) -> bool:
        return bool(self.share)

    @classmethod
    def of(cls, sessions: Iterable[Any]) -> ExpertTraffic:
        shares: dict[tuple[int, str], list[float]] = defaultdict(list)
        for sf in sessions:
            ex = getattr(sf, "experts", None)
            if ex is None or ex.empty or sf.ops.empty:
                continue
            n_expert = max(int(ex.attrs.get("n_expert", 0)), int(ex["expert"].max()) + 1)
            mm = sf.ops[sf.ops["op"].astype(str) == "MUL_MAT_ID"]
            size = {
                (int(s), int(u), int(la)): _tokens(sh)[1]
                for s, u, la, sh in mm[["step", "ubatch", "layer", "shape"]].itertuples(False)
            }
            used = ex[ex["tokens"] > 0].groupby(["step", "ubatch", "layer"])["expert"].nunique()
            for (s, u, la), k in used.items():  # type: ignore[misc]
                cls_ = size.get((int(s), int(u), int(la)))
                if cls_ is not None:
                    shares[(int(la), cls_)].append(int(k) / n_expert)
        return cls(
            share={k: sum(v) / len(v) for k, v in shares.items()},
            n={k: len(v) for k, v in shares.items()},
        )

    def node_shares(self, g: Graph, tokens: list[str]) -> dict[int, float]:
        """Each MUL_MAT_ID node of ``g`` whose layer and size the logs routed: the share of its
        experts it is priced at reading (``tokens``: each node's size class)."""
        out: dict[int, float] = {}
        for k, node in enumerate(g.nodes):
            if node.op != "MUL_MAT_ID":
                continue
            layer = layer_of(node)
            found = self.share.get((layer, tokens[k])) if layer is not None else None
            if found is not None:
                out[k] = found
        return out

    def routed(self, gc: GraphCosts) -> GraphCosts:
        """``gc`` with each expert matmul's bytes at the share of its experts the logs routed
        to (its weights' unread part taken off), the rest as they are."""
        shares = self.node_shares(gc.graph, gc.tokens)
        if not shares:
            return gc
        b = gc.bytes.copy()
        for k, share in shares.items():
            weights = derive.weight_bytes_read(gc.graph.nodes[k], gc.graph)
            b[k] -= weights * (1.0 - share)
        return replace(gc, bytes=b)
