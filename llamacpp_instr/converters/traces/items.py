"""What a trace is made of, whatever its file format: tracks, slices, counter samples, and the
batches in which a compute's layer and op slices travel to the writers (``layout`` lays a
session out as these; the Perfetto and Chrome JSON writers render them)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..reading.decode.columns import LayerSpan
from ..reading.decode.computes import Compute
from ..reading.decode.passes import Pass
from ..session.machine_peaks import Roof


@dataclass(frozen=True)
class Selection:
    """What to include: one layer only, a range of steps, or no ops at all; and whether op
    slices carry KV-cache flows (``kv_flows``)."""

    layer: int | None = None
    steps: tuple[int, int] | None = None  # [first, last) step index
    ops: bool = True
    flows: bool = False

    def wants_step(self, step: Pass) -> bool:
        return self.steps is None or self.steps[0] <= step.index < self.steps[1]


@dataclass
class Track:
    uuid: int
    name: str
    parent: int | None  # None: a process track
    kind: str  # "process", "slices" or "counter"
    order: int = 0
    pid: int = 0
    unit: str = ""
    labels: list[str] = field(default_factory=list)  # process tracks: session metadata


@dataclass
class Slice:
    track: int
    name: str
    ts: int
    dur: int
    depth: int
    category: str
    args: dict[str, Any] = field(default_factory=dict)
    flows_out: tuple[int, ...] = ()  # ids of the flows (KV cache writes to reads) it starts
    flows_in: tuple[int, ...] = ()  # ids of the flows it ends
    # its ``flows_out`` go on through it, begun by an earlier slice (a decode step carrying an
    # encode's embeddings): a step of each flow, where the others begin theirs
    carries: bool = False


@dataclass
class Sample:
    track: int
    ts: int
    value: float


Item = Track | Slice | Sample


@dataclass
class OpBatch:
    """The op slices of one packed compute, on ``track``, in one item.

    They are the slices a per-op layout yields for ``compute``'s ops (``op_static_args``,
    ``op_rates``; depth 3 inside a layer, else 2), only those where ``keep`` (a bool array over
    the compute's ops, or a slice of them) is true when it is set: the chosen layer's, and not
    those with flows (which follow as slices). ``roof``: the session's roofs, if its machine's
    peaks are known.
    """

    track: int
    compute: Compute
    keep: Any = None
    roof: Roof | None = None


@dataclass
class ComputeBatch:
    """A compute's slice, its layer slices (depth
    2, category ``layer``, named ``layer N`` with args ``layer`` and ``n_ops``, on the compute's
    track) and its ``OpBatch``: the items a per-op layout yields for the compute, up to the op
    slices that follow one by one (see ``SessionLayout.compute``)."""

    slice: Slice
    layers: Sequence[LayerSpan]
    ops: OpBatch | None


@dataclass(init=False)
class SliceRows:
    """Slices of one category and depth, as one item: the ``Slice`` items that
    ``items()`` yields one by one, with the tracks first used among them (``tracks``: (row, track),
    each yielded right before its row). The device layout gives its copies, command buffers and
    network commands this way (a few per op: one item each cost more than their encoding)."""

    category: str
    depth: int
    track: list[int]
    name: list[str]
    ts: list[int]
    dur: list[int]
    args: list[dict[str, Any]]
    tracks: list[tuple[int, Track]]
    flows_in: dict[int, tuple[int, ...]]  # row -> flows it ends

    def __init__(self, category: str, depth: int) -> None:
        # (by hand: the dataclass's, with a factory per list, cost twice as much, and a device
        # step makes a few of these)
        self.category = category
        self.depth = depth
        self.track = []
        self.name = []
        self.ts = []
        self.dur = []
        self.args = []
        self.tracks = []
        self.flows_in = {}

    def add(self, track: int, name: str, ts: int, dur: int, args: dict[str, Any]) -> None:
        self.track.append(track)
        self.name.append(name)
        self.ts.append(ts)
        self.dur.append(dur)
        self.args.append(args)

    def items(self) -> Iterator[Item]:
        """The same, item by item."""
        new = iter(self.tracks)
        nxt = next(new, None)
        for r, args in enumerate(self.args):
            while nxt is not None and nxt[0] == r:
                yield nxt[1]
                nxt = next(new, None)
            yield Slice(
                self.track[r],
                self.name[r],
                self.ts[r],
                self.dur[r],
                self.depth,
                self.category,
                args,
                (),
                self.flows_in.get(r, ()),
            )
        while nxt is not None:
            yield nxt[1]
            nxt = next(new, None)


BulkItem = Item | OpBatch | ComputeBatch | SliceRows


@dataclass
class LayoutStats:
    sessions: int = 0  # each a process of the trace
    steps: int = 0
    computes: int = 0
    layers: int = 0
    ops: int = 0
    flows: int = 0


def track_uuid(*parts: object) -> int:
    """Deterministic 63-bit id: the same log always gives the same trace."""
    return text_uuid("\0".join(map(str, parts)))


def text_uuid(text: str) -> int:
    """``track_uuid`` of the parts whose strings, joined by NULs, are ``text`` (a caller that
    makes many ids of one prefix joins it once)."""
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1 or 1
