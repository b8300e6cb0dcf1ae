"""The steps that a live log's figures (``live_figures.RequestTracker``) follow as they come: the
steps in flight, until their ``step_end`` (``StepsInFlight``), and the steps each sequence took
since its last request ended, until the record of the request that held it (``RequestSteps``).

Every value taken from a record is read through ``count`` or ``integer``, so that no figure made
of it overflows a metric or a span.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from .log_input import VALUE_MAX, is_encode, opt_count, step_seqs

MAX_LAYER_SPANS = 4096  # layer spans kept per step (a log's count is the log's: bounded here)

# a step_begin's sequences: (seq, n_tokens, first pos, last pos)
Seqs = list[tuple[int, int, int, int]]


def count(v: Any) -> int:
    """A count or time (ns): an integer from 0 to below 2**62, else ValueError or TypeError."""
    x = opt_count(v)
    if x is None:
        raise ValueError("a count or time is null")
    return x


def integer(v: Any) -> int:
    """An integer within 62 bits either side of 0 (a layer, a position), else ValueError."""
    if type(v) is not int or not -VALUE_MAX < v < VALUE_MAX:
        raise ValueError(f"{v!r} is not an integer within 2**62")
    return v


@dataclass(frozen=True)
class StepSpan:
    """A step a request's sequence took part in."""

    start: int  # ns, the log's clock
    end: int
    step: int  # step_begin.step
    tokens: int  # the sequence's tokens in the batch
    pos0: int  # the first position it decoded at


class StepsInFlight:
    """The steps begun and not yet ended, by (sid, ctx): what each ``step_begin`` said (the
    step's kind, None for an encoder's encode, and its sequences), and when its outputs were
    ready so far: its computes' and RPC commands' ends (``session.step_times.ready_at``: a step
    runs until then, not until llama_decode returns)."""

    def __init__(self) -> None:
        self.begun: dict[tuple[str, int], tuple[str | None, Seqs]] = {}
        self.ready: dict[tuple[str, int], int] = {}

    def begin(self, rec: dict[str, Any]) -> None:
        """A ``step_begin``."""
        if is_encode(rec):  # an encoder's: no sequence's tokens, no request's step
            count(rec["n_tokens"])
            self.begun[(str(rec["sid"]), int(rec["ctx"]))] = (None, [])
            return
        seqs = step_seqs(rec)
        if not seqs:  # a step without seqs holds sequence 0 only, at ``pos``
            pos = rec.get("pos") or [0, 0]
            seqs = [(0, int(rec["n_tokens"]), int(pos[0]), int(pos[1]))]
        for q, n, p0, p1 in seqs:
            count(q), count(n), integer(p0), integer(p1)
        self.begun[(str(rec["sid"]), int(rec["ctx"]))] = (str(rec["kind"]), seqs)

    def ready_at(self, rec: dict[str, Any], end: int) -> None:
        """Work of the step in flight of ``rec``'s context (if any) ended at ``end``."""
        key = (str(rec["sid"]), int(rec["ctx"]))
        if key in self.begun:
            self.ready[key] = max(self.ready.get(key, end), end)

    def end(self, rec: dict[str, Any]) -> tuple[str | None, Seqs, int, int] | None:
        """A ``step_end``: its step's kind and sequences, start and time until its outputs were
        ready; None if its ``step_begin`` was not read (the exporter began after it)."""
        key = (str(rec["sid"]), int(rec["ctx"]))
        begun, ready = self.begun.pop(key, None), self.ready.pop(key, 0)
        if begun is None:
            return None
        kind, seqs = begun
        start, dur = count(rec["t_start"]), count(rec["dur"])
        dur = max(dur, ready - start)  # until its outputs were ready (an RPC server's compute)
        return kind, seqs, start, dur

    def clear(self) -> None:
        self.begun.clear()
        self.ready.clear()

    def __len__(self) -> int:
        return len(self.begun)


class _SeqSteps:
    """One sequence's steps since its last request ended, as ``StepSpan`` fields in arrays of
    int64: 40 bytes a step."""

    FIELDS = ("start", "end", "step", "tokens", "pos0")

    def __init__(self) -> None:
        self.cols = [array("q") for _ in self.FIELDS]

    def add(self, row: tuple[int, int, int, int, int], cap: int) -> None:
        if len(self.cols[0]) >= cap:  # no record came for a long time: keep the newest half
            for c in self.cols:
                del c[: cap // 2]
        for c, v in zip(self.cols, row, strict=True):
            c.append(v)

    def take(self, t0: int, t1: int) -> list[StepSpan]:
        """The steps that began from ``t0`` to ``t1``, in time order; every step up to ``t1`` is
        forgotten (the next request of the sequence begins after it)."""
        rows = list(zip(*self.cols, strict=True))
        mine = sorted((StepSpan(*r) for r in rows if t0 <= r[0] <= t1), key=lambda s: s.start)
        if any(r[0] <= t1 for r in rows):
            later = [r for r in rows if r[0] > t1]
            self.cols = [array("q", (r[i] for r in later)) for i in range(len(self.FIELDS))]
        return mine

    def __len__(self) -> int:
        return len(self.cols[0])


class RequestSteps:
    """What the requests in flight need of the steps: each sequence's steps since its last
    request ended (``_SeqSteps``), taken when the record of the request that held it comes, and
    the steps' layer spans by step (the newest ``cap`` steps', where they are kept)."""

    def __init__(self) -> None:
        self.seqs: dict[int, _SeqSteps] = {}
        # step -> its layer spans (layer, start, end)
        self.layers: dict[int, list[tuple[int, int, int]]] = {}

    def add(self, seqs: Seqs, start: int, end: int, step: int, cap: int) -> None:
        """A step that ended: a row of each of its sequences' (``cap``: rows kept per sequence)."""
        for q, n, p0, _ in seqs:
            self.seqs.setdefault(q, _SeqSteps()).add((start, end, step, n, p0), cap)

    def add_layers(self, rec: dict[str, Any], cap: int) -> None:
        """A compute's layer spans, kept under its step (a step of several ubatches has several
        computes); the oldest step's go once ``cap`` steps are kept."""
        t0, step = count(rec["t_start"]), count(rec["step"])
        spans = self.layers.get(step)
        if spans is None:
            if len(self.layers) >= cap:
                del self.layers[next(iter(self.layers))]
            spans = self.layers[step] = []
        for row in rec.get("layers") or []:
            layer, off, dur = integer(row[0]), count(row[1]), count(row[2])
            if len(spans) < MAX_LAYER_SPANS:
                spans.append((layer, t0 + off, t0 + off + dur))

    def take(self, q: int, t0: int, t1: int) -> list[StepSpan]:
        """Sequence ``q``'s steps that began from ``t0`` to ``t1`` (``_SeqSteps.take``)."""
        steps = self.seqs.get(q)
        return steps.take(t0, t1) if steps is not None else []

    def layers_of(self, steps: list[StepSpan]) -> dict[int, list[tuple[int, int, int]]]:
        """The layer spans kept of ``steps``, by step."""
        return {st.step: self.layers[st.step] for st in steps if st.step in self.layers}

    def running(self) -> int:
        """Sequences with a request in flight (steps since their last request's end)."""
        return sum(1 for s in self.seqs.values() if len(s))

    def clear(self) -> None:
        """A new run: the requests in flight in an earlier one will never end, and its steps'
        layer spans are no step's of the new run (which numbers its steps from 0 again)."""
        self.seqs.clear()
        self.layers.clear()

    def __len__(self) -> int:
        return sum(len(s) for s in self.seqs.values()) + len(self.layers)
