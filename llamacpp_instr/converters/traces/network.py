"""The ``network`` track of a run on RPC servers: a track per server with every command sent to it
(the model's upload first), its bytes and the rate achieved (``transfers`` records)."""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..reading.decode.transfers import TransferRow
from ..session import device_time as dt
from .device_lanes import NETWORK_ORDER, DeviceLanes
from .items import Item, Slice, Track, track_uuid


class NetworkTracks:
    """A session's network track and its per-server lanes."""

    def __init__(self, info: SessionInfo, lanes: DeviceLanes) -> None:
        self.info = info
        self.lanes = lanes
        self.network: Track | None = None
        self.transfers_done = 0

    def transfers(self, step: Step | None = None) -> Iterator[Item]:
        """The RPC commands of ``step``, or (None) those outside any step not drawn yet."""
        if step is not None:
            blocks = step.transfers
        else:
            blocks = self.info.transfers[self.transfers_done :]
            self.transfers_done = len(self.info.transfers)
        rows = [(t.phase, r) for t in blocks for r in t.rows]
        if not rows:
            return
        if self.network is None:
            self.network = Track(
                track_uuid(self.lanes.sid, "network"),
                "network",
                self.lanes.process.uuid,
                "slices",
                NETWORK_ORDER,
                self.lanes.process.pid,
            )
            yield self.network
        for phase, r in sorted(rows, key=lambda x: (x[1].start, x[1].end)):
            yield from self._command(phase, r)

    def _command(self, phase: str, r: TransferRow) -> Iterator[Item]:
        assert self.network is not None
        dev = self.lanes.devs[r.device]
        name = f"network: {dev.label}"
        lanes = self.lanes.get(
            ("net", r.device), name, self.lanes.rank(r.device), self.network.uuid
        )
        args = {"device": dev.label, "phase": phase, **dt.transfer_args(r)}
        yield from self.lanes.place(
            lanes, Slice(0, r.cmd, r.start, r.end - r.start, 0, "transfer", args)
        )
