"""Graph records: a graph's node table (``Node``, ``Graph``, ``graph_table``)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from .fields import VALUE_MAX

# the dimensions of a ggml tensor's shape (GGML_MAX_DIMS): the most a node or source has
DIMS_MAX = 4


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


class Graph:
    """A compute graph's node table (a ``graph`` record). Equal only to itself, and hashable: what
    is worked out once per graph (its layers, its ops' static args...) is kept in dicts keyed by
    the graph.

    A graph that names another's table (``same_as``, with or without ``subst``) makes its nodes
    when first read (``named``: the table named, and the substitution), not when its record is
    read: a record of a hundred bytes naming a table of a thousand nodes costs its own size until
    a compute of it is read."""

    nodes: list[Node]

    def __init__(
        self,
        ctx: int,
        id: int,  # noqa: A002 (the record's name)
        n_tokens: int,
        nodes: list[Node] | None = None,
        *,
        named: tuple[Graph, Subst | None, dict[int, int]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.id = id
        self.n_tokens = n_tokens
        if nodes is not None:
            self.nodes = nodes
        else:
            assert named is not None
            self._named = named

    def __getattr__(self, name: str) -> Any:
        """``nodes``, made once, when first read (an attribute from then on)."""
        if name != "nodes" or "_named" not in self.__dict__:
            raise AttributeError(name)
        base, m, at = self.__dict__.pop("_named")
        nodes = base.nodes if m is None else _subst_nodes(base.nodes, m, at)
        self.nodes = nodes
        return nodes

    def __repr__(self) -> str:
        return f"Graph(ctx={self.ctx}, id={self.id}, n_tokens={self.n_tokens})"


def graph_table(rec: dict[str, Any]) -> Graph:
    nodes = list(map(_node, rec["nodes"]))
    # sources must point at nodes of this graph, or describe a tensor
    for node in nodes:
        for x in node.src:
            if "node" in x and not 0 <= int(x["node"]) < len(nodes):
                raise ValueError(f"node {node.i} has a source outside the graph")
    return Graph(
        ctx=int(rec["ctx"]), id=int(rec["graph"]), n_tokens=int(rec["n_tokens"]), nodes=nodes
    )


def _node(n: dict[str, Any]) -> Node:
    """A node of a table written whole. Its values converted as ``int``, ``str`` and ``opt_int``
    would (in the same order: the same error for a damaged one), those already of their type
    taken as they are (a table has a thousand nodes, ten values each: a call per value cost
    half the reading)."""
    i = n["i"]
    i = i if type(i) is int else int(i)
    name = n["name"]
    name = name if type(name) is str else str(name)
    op = n["op"]
    op = op if type(op) is str else str(op)
    sub = n.get("sub")
    sub = None if sub is None else sub if type(sub) is str else str(sub)
    layer = n.get("layer")
    layer = None if layer is None else layer if type(layer) is int else int(layer)
    shape = list(map(int, n["shape"]))
    if len(shape) > DIMS_MAX or (shape and max(shape) >= VALUE_MAX):
        raise ValueError(f"node {i} has a shape of {len(shape)} dimensions or beyond 2**62")
    dtype = n["dtype"]
    dtype = dtype if type(dtype) is str else str(dtype)
    nbytes = n["bytes"]
    nbytes = nbytes if type(nbytes) is int else int(nbytes)
    if not 0 <= nbytes < VALUE_MAX:
        raise ValueError(f"node {i} has {nbytes} bytes")
    src = [x for x in n.get("src", ()) if isinstance(x, dict)]
    return Node(
        i, name, op, sub, layer, shape, dtype, nbytes, src, list(map(str, n.get("flags", ())))
    )


# node tables a reader keeps for the graphs that name one (``same_as``): the writer names only
# tables of the same file, and at most 4096 per context before it writes them whole again; the
# numbers of the 16 tables written whole it named last (table_memory's TABLES_MAX, BASES_MAX)
TABLES_KEPT = 65536
TABLES_PER_CTX = 4096
BASES_PER_CTX = 16
# triples a ``subst`` may hold, and pairs a ``subst_at`` (the writer's table_memory::SUBST_MAX
# and AT_MAX)
SUBST_MAX = 256
AT_MAX = 1024
# where a number of a ``subst`` is: 0 to 3, that dimension of a shape; this, the bytes
SUBST_BYTES = 4
_INT64_MAX = 2**63 - 1

# a substitution: (where, old value) -> new value
Subst = dict[tuple[int, int], int]


def substitution(raw: Any) -> Subst:
    """A graph record's ``subst``: triples [where, old, new], where 0 to SUBST_BYTES, old and new
    non-negative 64-bit integers, each (where, old) once and changed, at most SUBST_MAX of them
    (else ValueError or TypeError)."""
    if type(raw) is not list:
        raise TypeError("subst is not a list")
    if len(raw) > SUBST_MAX:
        raise ValueError(f"subst holds {len(raw)} triples, more than {SUBST_MAX}")
    out: Subst = {}
    for triple in raw:
        if type(triple) is not list or len(triple) != 3:
            raise ValueError("a subst entry is not a list of 3 values")
        where, old, new = triple
        if type(where) is not int or type(old) is not int or type(new) is not int:
            raise TypeError("a subst entry holds a value that is not an integer")
        if not 0 <= where <= SUBST_BYTES:
            raise ValueError(f"a subst entry's place {where} is not 0 to {SUBST_BYTES}")
        if not (0 <= old <= _INT64_MAX and 0 <= new <= _INT64_MAX):
            raise ValueError("a subst value is not a non-negative 64-bit integer")
        if old == new or (where, old) in out:
            raise ValueError(f"subst maps {old} (place {where}) twice or to itself")
        out[(where, old)] = new
    return out


def positions(raw: Any) -> dict[int, int]:
    """A graph record's ``subst_at``: pairs [position, value] of non-negative 64-bit integers,
    each position once, at most AT_MAX of them (else ValueError or TypeError)."""
    if type(raw) is not list:
        raise TypeError("subst_at is not a list")
    if not 0 < len(raw) <= AT_MAX:
        raise ValueError(f"subst_at holds {len(raw)} pairs, not 1 to {AT_MAX}")
    out: dict[int, int] = {}
    for pair in raw:
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("a subst_at entry is not a list of 2 values")
        pos, value = pair
        if type(pos) is not int or type(value) is not int:
            raise TypeError("a subst_at entry holds a value that is not an integer")
        if not (0 <= pos <= _INT64_MAX and 0 <= value <= _INT64_MAX):
            raise ValueError("a subst_at value is not a non-negative 64-bit integer")
        if pos in out:
            raise ValueError(f"subst_at sets position {pos} twice")
        out[pos] = value
    return out


def _subst_shape(shape: list[Any], m: Subst, at: dict[int, int], pos: int) -> list[Any]:
    """A shape with its numbers substituted, the first at position ``pos`` of the table."""
    return [
        at[pos + d] if pos + d in at else m.get((d, v), v) if type(v) is int else v
        for d, v in enumerate(shape)
    ]


def _subst_bytes(nbytes: Any, m: Subst, at: dict[int, int], pos: int) -> Any:
    if pos in at:
        return at[pos]
    return m.get((SUBST_BYTES, nbytes), nbytes) if type(nbytes) is int else nbytes


def _subst_source(x: dict[str, Any], m: Subst, at: dict[int, int], pos: int) -> dict[str, Any]:
    """A leaf source with the numbers of its shape and bytes substituted (itself if none
    changes), its first number at position ``pos`` of the table."""
    shape, nbytes = x.get("shape"), x.get("bytes")
    shape_list = shape if type(shape) is list else []
    new_shape = _subst_shape(shape_list, m, at, pos) if type(shape) is list else shape
    new_bytes = _subst_bytes(nbytes, m, at, pos + len(shape_list))
    if new_shape == shape and new_bytes == nbytes:
        return x
    # the keys in the record's order, as a table written whole gives them
    return {
        k: new_shape if k == "shape" else new_bytes if k == "bytes" else v for k, v in x.items()
    }


def _subst_nodes(nodes: list[Node], m: Subst, at: dict[int, int]) -> list[Node]:
    """``nodes`` with every number of their shapes and bytes, and their leaf sources', mapped by
    ``m``, or set by its position in the table (``at``: the numbers counted in the order the
    record writes them, a node's shape and bytes, then each of its leaf sources' shape and
    bytes); a node none of whose numbers changes is kept as it is (shared with the base)."""
    out = []
    pos = 0
    for n in nodes:
        shape = _subst_shape(n.shape, m, at, pos)
        nbytes = _subst_bytes(n.bytes, m, at, pos + len(n.shape))
        pos += len(n.shape) + 1
        src = []
        for x in n.src:
            if "node" in x:
                src.append(x)
                continue
            src.append(_subst_source(x, m, at, pos))
            shape_x = x.get("shape")
            pos += (len(shape_x) if type(shape_x) is list else 0) + 1
        if (
            shape == n.shape
            and nbytes == n.bytes
            and all(a is b for a, b in zip(src, n.src, strict=True))
        ):
            out.append(n)
        else:
            out.append(replace(n, shape=shape, bytes=nbytes, src=src))
    return out


def numbers_in(g: Graph) -> int:
    """How many numbers of shapes and bytes ``g``'s record writes (what ``subst_at`` counts in),
    counted once per table."""
    n = g.__dict__.get("_numbers")
    if n is None:
        n = 0
        for node in g.nodes:
            n += len(node.shape) + 1
            for x in node.src:
                if "node" not in x:
                    shape_x = x.get("shape")
                    n += (len(shape_x) if type(shape_x) is list else 0) + 1
        g.__dict__["_numbers"] = n
    return n


class Tables(dict[tuple[int, int], Graph]):
    """The node tables a session's graphs may name, (ctx, graph id) -> Graph, held within the
    writer's own bounds (``table_memory``): at most TABLES_PER_CTX per context (the oldest
    forgotten first: the writer starts over past as many in a file), and, of those written
    whole, the BASES_PER_CTX most recently named per context, which alone a ``subst`` may name
    (the writer keeps the numbers of as many)."""

    def __init__(self) -> None:
        super().__init__()
        self.order: dict[int, OrderedDict[int, None]] = {}  # per ctx: ids, oldest first
        self.bases: dict[int, OrderedDict[int, None]] = {}  # per ctx: least recently named first

    def keep(self, g: Graph, whole: bool) -> None:
        order = self.order.setdefault(g.ctx, OrderedDict())
        order.pop(g.id, None)
        if len(order) >= TABLES_PER_CTX:
            self.pop((g.ctx, order.popitem(last=False)[0]), None)
        order[g.id] = None
        if len(self) >= TABLES_KEPT and (g.ctx, g.id) not in self:
            old = next(iter(self))
            del self[old]
            self.order[old[0]].pop(old[1], None)
            base_ids = self.bases.get(old[0])
            if base_ids is not None:
                base_ids.pop(old[1], None)
        self[(g.ctx, g.id)] = g
        bases = self.bases.setdefault(g.ctx, OrderedDict())
        bases.pop(g.id, None)
        if whole:
            if len(bases) >= BASES_PER_CTX:
                bases.popitem(last=False)
            bases[g.id] = None

    def named_base(self, ctx: int, same: int) -> None:
        """``subst`` names graph ``same`` of ``ctx``: one of the bases (else ValueError), which
        becomes the most recently named."""
        bases = self.bases.get(ctx)
        if bases is None or same not in bases:
            raise ValueError(
                f"a subst names graph {same}, not one of the last {BASES_PER_CTX} tables written "
                "whole in its context"
            )
        bases.move_to_end(same)


def same_table(rec: dict[str, Any], tables: dict[tuple[int, int], Graph]) -> Graph:
    """A graph record naming the node table of an earlier graph of its context (``same_as``):
    that table, under this graph's id and tokens; with ``subst`` (and ``subst_at``), that table
    with the numbers of its shapes and bytes substituted, each where it is (a dimension of a
    shape, or bytes), and those ``subst_at`` names set by their position. Its nodes are made when
    first read (``Graph``); what could make them fail is checked here."""
    ctx, same = int(rec["ctx"]), int(rec["same_as"])
    m = substitution(rec["subst"]) if "subst" in rec else None
    at = positions(rec["subst_at"]) if "subst_at" in rec else {}
    if at and m is None:
        raise ValueError(f"graph {rec['graph']} has a subst_at but no subst")
    base = tables.get((ctx, same))
    if base is None:
        raise ValueError(f"graph {rec['graph']} names graph {same}, whose table is not in the log")
    if m is not None and isinstance(tables, Tables):
        tables.named_base(ctx, same)
    if at and max(at) >= numbers_in(base):
        raise ValueError(
            f"subst_at names position {max(at)} of a table of {numbers_in(base)} numbers"
        )
    return Graph(ctx, int(rec["graph"]), int(rec["n_tokens"]), named=(base, m, at))


def graph_record(rec: dict[str, Any], tables: dict[tuple[int, int], Graph]) -> Graph:
    """A ``graph`` record's graph: its node table written whole, or named (``same_as``, with or
    without ``subst``) from ``tables``, which keeps each table written whole or by ``subst``
    (what a later record may name): a ``Tables``, within the writer's bounds, or any dict,
    TABLES_KEPT at most."""
    if "same_as" in rec:
        g = same_table(rec, tables)
        if "subst" not in rec:
            return g
        whole = False
    elif "subst" in rec or "subst_at" in rec:
        raise ValueError(f"graph {rec['graph']} has a subst but names no table")
    else:
        g = graph_table(rec)
        whole = True
    if isinstance(tables, Tables):
        tables.keep(g, whole)
        return g
    if len(tables) >= TABLES_KEPT:
        tables.pop(next(iter(tables)))
    tables[(g.ctx, g.id)] = g
    return g
