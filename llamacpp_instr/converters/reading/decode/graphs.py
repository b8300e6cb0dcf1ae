"""Graph records: a graph's node table (``Node``, ``Graph``, ``graph_table``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import opt_int


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


def graph_table(rec: dict[str, Any]) -> Graph:
    nodes = [
        Node(
            i=int(n["i"]),
            name=str(n["name"]),
            op=str(n["op"]),
            sub=None if n.get("sub") is None else str(n["sub"]),
            layer=opt_int(n.get("layer")),
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


# whole node tables a reader keeps for the graphs that name one (``same_as``): the writer names
# only tables of the same file, and at most 4096 per context before it writes them whole again
TABLES_KEPT = 65536


def same_table(rec: dict[str, Any], tables: dict[tuple[int, int], Graph]) -> Graph:
    """A graph record naming the node table of an earlier graph of its context (``same_as``):
    that table, under this graph's id and tokens."""
    ctx, same = int(rec["ctx"]), int(rec["same_as"])
    base = tables.get((ctx, same))
    if base is None:
        raise ValueError(f"graph {rec['graph']} names graph {same}, whose table is not in the log")
    return Graph(ctx=ctx, id=int(rec["graph"]), n_tokens=int(rec["n_tokens"]), nodes=base.nodes)
