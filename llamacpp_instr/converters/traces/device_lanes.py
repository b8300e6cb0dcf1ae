"""The tracks of a run on several devices, for ``devices.DeviceTracks``: one per device and per
kind of slice, in a fixed order among the session's tracks, and a further lane (``NAME (2)``...)
for a slice that would overlap the last one on its track (they should not, but a log is data)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..session import device_time as dt
from .items import Item, Slice, Track, track_uuid

# track order among the session's tracks (steps: the context id; threads: 10 + n; counters: 100+)
DEVICE_ORDER = 20  # + 2 per device, + 1 for its own-timing track
COPIES_ORDER = 70
NETWORK_ORDER = 71


class Lanes:
    """A track that may need more lanes: a slice goes on the first lane free at its start.
    ``uuids`` and ``ends``: each lane's track id and the end of its last slice (lists side by
    side: a compute places a few dozen slices, each one reading the first lane)."""

    def __init__(self, key: tuple[Any, ...], name: str, order: int, parent: int | None) -> None:
        self.key, self.name, self.order, self.parent = key, name, order, parent
        self.uuids: list[int] = []
        self.ends: list[int] = []


# (the lanes a loop over runs of rows holds before its first row, which always sets its own:
# never placed on)
NO_LANES = Lanes((), "", 0, None)


class DeviceLanes:
    """A session's device tracks, each with its lanes, made when first used."""

    def __init__(self, sid: str, process: Track, devs: dt.Devices, bulk: bool = False) -> None:
        self.sid = sid
        self.bulk = bulk  # slices in bulk (``SliceRows``: ``assign``), else one by one
        self.process = process
        self.devs = devs
        self.order = {d: k for k, d in enumerate(devs.order(devs.known))}
        self.tracks: dict[tuple[Any, ...], Lanes] = {}

    def rank(self, d: int) -> int:
        return DEVICE_ORDER + 2 * self.order.get(d, len(self.order) + max(d, 0))

    def _new_lane(self, lanes: Lanes) -> Track:
        """A new lane of ``lanes``: ``NAME``, then ``NAME (2)``..."""
        k = len(lanes.uuids)
        name = lanes.name if k == 0 else f"{lanes.name} ({k + 1})"
        parent = lanes.parent if lanes.parent is not None else self.process.uuid
        tr = Track(
            track_uuid(self.sid, *lanes.key, k),
            name,
            parent,
            "slices",
            lanes.order,
            self.process.pid,
        )
        lanes.uuids.append(tr.uuid)
        lanes.ends.append(0)
        return tr

    def place(self, lanes: Lanes, s: Slice) -> Iterator[Item]:
        """``s`` (its track left unset) on the first of ``lanes``' tracks free at its start."""
        k = next((k for k, last in enumerate(lanes.ends) if last <= s.ts), None)
        if k is None:
            k = len(lanes.ends)
            yield self._new_lane(lanes)
        lanes.ends[k] = s.ts + s.dur
        s.track = lanes.uuids[k]
        yield s

    def assign(
        self, lanes: Lanes, ts: int, end: int, row: int, new: list[tuple[int, Track]]
    ) -> int:
        """``place`` for a slice from ``ts`` to ``end``, row ``row`` of a ``SliceRows``: the
        track it goes on (a new lane is added to ``new``)."""
        ends = lanes.ends
        for k, last in enumerate(ends):
            if last <= ts:
                ends[k] = end
                return lanes.uuids[k]
        tr = self._new_lane(lanes)
        new.append((row, tr))
        ends[-1] = end
        return tr.uuid

    def get(self, key: tuple[Any, ...], name: str, order: int, parent: int | None = None) -> Lanes:
        lanes = self.tracks.get(key)
        if lanes is None:
            lanes = self.tracks[key] = Lanes(key, name, order, parent)
        return lanes

    def device_track(self, d: int) -> Iterator[Item]:
        """Device ``d``'s track, yielded when first used (one lane: a device's parts of its
        computes never overlap)."""
        lanes = self.get(("device", d), self.devs[d].label, self.rank(d))
        if not lanes.uuids:
            yield self._new_lane(lanes)

    def track_of(self, d: int) -> int:
        return self.tracks[("device", d)].uuids[0]
