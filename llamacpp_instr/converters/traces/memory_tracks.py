"""Memory in a trace: a counter track per device and purpose (the bytes its backend buffers hold
over the session) and each buffer made, freed or refused as an instant on a "memory" track."""

from __future__ import annotations

from collections.abc import Iterator

from llamacpp_instr.contract.units import fmt_bytes

from ..reading.decode.sessions import SessionInfo
from ..session.memory_timeline import device_names, failure_line
from .items import Item, Sample, Slice, Track, track_uuid

# after the session's other counters (tokens/s 100, KV cells 101, session_start's memory 102-104)
ORDER = 110


class MemoryTracks:
    """One session's memory tracks, fed the allocations read since the last call."""

    def __init__(self, info: SessionInfo, process: Track) -> None:
        self.info = info
        self.process = process
        self.names = device_names(info)
        self.counters: dict[tuple[int, str], Track] = {}
        self.live: dict[tuple[int, str], int] = {}
        self.events: Track | None = None
        self.seen_alloc: set[int] = set()
        self.seen_free: set[int] = set()
        self.failures_done = 0

    def _name(self, device: int) -> str:
        return self.names.get(device, f"device {device}")

    def _counter(self, device: int, purpose: str) -> Iterator[Item]:
        key = (device, purpose)
        if key not in self.counters:
            t = Track(
                track_uuid(self.info.sid, "memory", device, purpose),
                f"memory {self._name(device)}: {purpose}",
                self.process.uuid,
                "counter",
                ORDER + len(self.counters),
                self.process.pid,
                "bytes",
            )
            self.counters[key] = t
            self.live[key] = 0
            yield t

    def _events(self) -> Iterator[Item]:
        if self.events is None:
            self.events = Track(
                track_uuid(self.info.sid, "memory", "events"),
                "memory: buffers",
                self.process.uuid,
                "slices",
                -200,  # above the requests and the steps
                self.process.pid,
            )
            yield self.events

    def pending(self) -> bool:
        """Whether ``items`` may have something to give: any buffer (made or freed since, which
        only ``items`` tells), or failures read since the last call."""
        return bool(self.info.allocations) or self.failures_done < len(self.info.memory_failures)

    def items(self) -> Iterator[Item]:
        """Counter samples and instants for the buffers made and freed (and the allocations
        refused) since the last call, in time order."""
        new: list[tuple[int, int, int, bool]] = []  # ts, order, id, freed
        for a in self.info.allocations.values():
            if a.id not in self.seen_alloc:
                self.seen_alloc.add(a.id)
                new.append((a.ts, 0, a.id, False))
            if a.freed is not None and a.id not in self.seen_free:
                self.seen_free.add(a.id)
                new.append((a.freed, 1, a.id, True))
        new.sort()
        for ts, _, id_, freed in new:
            a = self.info.allocations[id_]
            key = (a.device, a.purpose)
            yield from self._counter(*key)
            self.live[key] += -a.bytes if freed else a.bytes
            yield Sample(self.counters[key].uuid, ts, float(self.live[key]))
            yield from self._events()
            assert self.events is not None
            what = "freed" if freed else "allocated"
            args = {
                "id": a.id,
                "device": self._name(a.device),
                "buffer_type": a.buffer_type,
                "purpose": a.purpose,
                "bytes": a.bytes,
            }
            if a.cache is not None:
                args["cache"] = a.cache
            if a.step is not None:
                args["step"] = a.step  # a compute buffer a step's graph grew
            name = f"{what} {a.purpose} {fmt_bytes(a.bytes)} on {self._name(a.device)}"
            yield Slice(self.events.uuid, name, ts, 0, 0, "memory", args)
        failures = self.info.memory_failures
        while self.failures_done < len(failures):
            f = failures[self.failures_done]
            self.failures_done += 1
            yield from self._events()
            assert self.events is not None
            ts = int(f.get("ts", self.info.last_ts))
            args = {k: v for k, v in f.items() if not isinstance(v, dict)}
            args.update({f"held {k}": v for k, v in f["held"].items()})
            yield Slice(self.events.uuid, failure_line(f), ts, 0, 0, "memory", args)
