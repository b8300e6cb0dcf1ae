"""A mixture of experts' load in a trace: a counter track per layer, ``experts used:
layer N``, whose value at each compute (ubatch) is the number of that layer's experts its router
sent tokens to: the experts its MUL_MAT_IDs read. A sample sits where the layer began in that
compute (its first timed op), else where the compute began, and holds until the next compute.

Only computes whose routing the log recorded (``experts`` records: a MoE at --level detailed on
the CPU) have samples: a log without them has no such track, nothing is guessed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..reading.decode.passes import Pass
from .items import Item, Sample, Track, track_uuid

# after the session's other counters (tokens/s 100, KV cells 101, memory 102-104 and 110+)
ORDER = 300


class ExpertTracks:
    """One session's expert-load counters, made as layers first route."""

    def __init__(self, sid: str, process: Track, layer: int | None = None) -> None:
        self.sid = sid
        self.process = process
        self.layer = layer  # the one layer a selection keeps (None: all)
        self.tracks: dict[int, Track] = {}

    def _track(self, layer: int) -> Iterator[Item]:
        if layer not in self.tracks:
            t = Track(
                track_uuid(self.sid, "experts used", layer),
                f"experts used: layer {layer}",
                self.process.uuid,
                "counter",
                ORDER + layer,
                self.process.pid,
                "experts",
            )
            self.tracks[layer] = t
            yield t

    def step(self, step: Pass) -> Iterator[Item]:
        """The samples of ``step``'s computes whose routing the log holds."""
        if not step.experts:
            return
        computes = {c.ubatch: c for c in step.computes}
        for r in step.experts:
            c = computes.get(r.ubatch)
            if c is None:
                continue  # routing of a compute the log did not keep: no time to put it at
            used = r.used()
            starts = _layer_starts(c)
            for layer in sorted(used):
                if self.layer is not None and layer != self.layer:
                    continue
                yield from self._track(layer)
                ts = starts.get(layer, c.start)
                yield Sample(self.tracks[layer].uuid, ts, float(used[layer]))


def _layer_starts(c: Any) -> dict[int, int]:
    """Where each layer began in compute ``c`` (its first timed op)."""
    out: dict[int, int] = {}
    for span in c.layers:
        if span.layer not in out or span.start < out[span.layer]:
            out[span.layer] = span.start
    return out
