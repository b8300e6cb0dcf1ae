"""The host's work between a context's steps on the trace (``host`` records): under each
context's ``decode steps`` track, a track per slot (sequence), ``slot N: sampling``, with a slice
for each window between two steps in which the slot's outputs were sampled (and the program's own
work for it), beside the steps that decoded them; and ``between steps`` for the work of no slot in
particular (building the next batch, writing the step's records). A slice's args give its request,
its sampling, chain and program times, and each sampler, grammar pass and part by name.

A record's parts are sums over its window, not intervals: a slice spans its sequence's first to
last recorded instant, and names what it holds in its args.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.host import HostWork
from .items import Item, Slice, Track, track_uuid

MAX_TRACKS = 1024  # slot tracks a session shows (a damaged log's sequence ids: bounded)
ARGS_PARTS = 16  # parts named in a slice's args, costliest first


class HostTracks:
    """One session's slot tracks, each under its context's steps track."""

    def __init__(self, sid: str, pid: int) -> None:
        self.sid = sid
        self.pid = pid
        self.tracks: dict[tuple[int, int], Track] = {}
        self.ends: dict[tuple[int, int], int] = {}  # where each track's last slice ended

    def _track(self, ctx: int, seq: int, parent: int) -> Iterator[Item]:
        key = (ctx, seq)
        if key in self.tracks or len(self.tracks) >= MAX_TRACKS:
            return
        name = "between steps" if seq < 0 else f"slot {seq}: sampling"
        tr = Track(track_uuid(self.sid, "host", ctx, seq), name, parent, "slices", seq, self.pid)
        self.tracks[key] = tr
        yield tr

    def items(self, h: HostWork, parent: int) -> Iterator[Item]:
        """The slices of ``h``, a track per sequence under ``parent`` (its context's steps
        track)."""
        if not h.seqs:  # MINIMAL: the window's totals, for no slot in particular
            yield from self._track(h.ctx, -1, parent)
            tr = self.tracks.get((h.ctx, -1))
            if tr is not None and h.sampled:
                totals: dict[str, object] = {"step": h.step, "sampled": h.sampled}
                totals["sampling_ms"] = h.sample_ns / 1e6
                totals |= {"chain_ms": h.chain_ns / 1e6, "program_ms": h.host_ns / 1e6}
                yield Slice(tr.uuid, "sampling", h.t_start, h.dur, 0, "host", totals)
        for row, q in enumerate(h.seqs):
            yield from self._track(h.ctx, q.seq, parent)
            tr = self.tracks.get((h.ctx, q.seq))
            if tr is None:
                continue
            t0 = max(h.t_start + q.start_off, self.ends.get((h.ctx, q.seq), 0))
            t1 = max(h.t_start + q.end_off, t0)
            self.ends[(h.ctx, q.seq)] = t1
            parts = sorted((p for p in h.parts if p.row == row), key=lambda p: -p.ns)
            args: dict[str, object] = {
                "step": h.step,
                "sampled": q.sampled,
                "sampling_ms": q.sample_ns / 1e6,
                "chain_ms": q.chain_ns / 1e6,
                "program_ms": q.host_ns / 1e6,
            }
            if q.request is not None:
                args["request"] = q.request
            for p in parts[:ARGS_PARTS]:
                args[f"{p.kind}: {p.name} (ms)"] = p.ns / 1e6
            top = next((p for p in parts if p.kind != "host" and p.ns), None)
            if q.sampled:
                name = "sampling" + (f" ({p_name(top.kind, top.name)})" if top else "")
            else:
                name = parts[0].name if parts else "host"
            yield Slice(tr.uuid, name, t0, t1 - t0, 0, "host", args)


def p_name(kind: str, name: str) -> str:
    """A part as a slice names its costliest: ``penalties``, ``grammar full``."""
    return f"grammar {name}" if kind == "grammar" else name
