"""A session's own counters in a trace: ``tokens/s`` (each decode step's tokens over its time),
``KV cache cells`` (used after each pass), and the memory its ``session_start`` reports
(``memory: weights``, ``KV cache``, ``compute buffers``: one sample each, at the start). Their
order (100-104) comes before the other counters' (``memory_tracks``, ``expert_tracks``)."""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.passes import Pass
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from .items import Item, Sample, Track, track_uuid


class CounterTracks:
    """One session's tokens/s, KV cells and session_start memory counters."""

    def __init__(self, info: SessionInfo, process: Track) -> None:
        self.info = info
        self.process = process
        self.pid = process.pid
        sid = info.sid
        self.tok_s = Track(
            track_uuid(sid, "tok/s"),
            "tokens/s",
            self.process.uuid,
            "counter",
            100,
            self.pid,
            "tokens/s",
        )
        self.kv = Track(
            track_uuid(sid, "kv"),
            "KV cache cells",
            self.process.uuid,
            "counter",
            101,
            self.pid,
            "cells",
        )

    def start(self) -> Iterator[Item]:
        """The tracks, and the memory counters' samples."""
        yield self.tok_s
        yield self.kv
        mem = self.info.memory
        for k, (key, label) in enumerate(
            [
                ("weights", "memory: weights"),
                ("kv_cache", "memory: KV cache"),
                ("compute", "memory: compute buffers"),
            ]
        ):
            if key in mem:
                t = Track(
                    track_uuid(self.info.sid, "mem", key),
                    label,
                    self.process.uuid,
                    "counter",
                    102 + k,
                    self.pid,
                    "bytes",
                )
                yield t
                yield Sample(t.uuid, self.info.start_ts, float(mem[key]))

    def tokens_per_s(self, step: Step) -> Iterator[Item]:
        """A decode step's tokens/s, where it ended and took time."""
        if step.dur > 0 and step.ended:
            yield Sample(self.tok_s.uuid, step.end, step.n_tokens / (step.dur / 1e9))

    def kv_used(self, p: Pass) -> Iterator[Item]:
        """The KV cells a pass left used, where it says."""
        if p.kv_used >= 0:
            yield Sample(self.kv.uuid, p.end, float(p.kv_used))
