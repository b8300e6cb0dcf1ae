"""The ``network`` track of a run on RPC servers: a track per server with every command sent to it
(the model's upload first), its bytes and the rate achieved (``transfers`` records)."""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..reading.decode.transfers import TransferRow
from ..session import device_time as dt
from .device_lanes import NETWORK_ORDER, DeviceLanes, Lanes
from .items import Item, Slice, SliceRows, Track, track_uuid


class NetworkTracks:
    """A session's network track and its per-server lanes."""

    def __init__(self, info: SessionInfo, lanes: DeviceLanes) -> None:
        self.info = info
        self.lanes = lanes
        self.network: Track | None = None
        self.transfers_done = 0

    def transfers(self, step: Step | None = None) -> Iterator[Item | SliceRows]:
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
        rows.sort(key=lambda x: (x[1].start, x[1].end))
        if self.lanes.bulk:
            yield self._commands(rows)
            return
        for phase, r in rows:
            yield from self._command(phase, r)

    def _commands(self, rows: list[tuple[str, TransferRow]]) -> SliceRows:
        """``_command`` for each of ``rows`` (sorted), as one item."""
        out = SliceRows("transfer", 0)
        labels: dict[int, tuple[str, Lanes]] = {}
        assign = self.lanes.assign
        # (SliceRows.add, inlined: a few rows per op)
        tracks, names, starts, durs, all_args = out.track, out.name, out.ts, out.dur, out.args
        for j, (phase, r) in enumerate(rows):
            got = labels.get(r.device)
            if got is None:
                label = self.lanes.devs[r.device].label
                got = labels[r.device] = (label, self._lanes(r.device, label))
            label, lanes = got
            start, end = r.start, r.end
            dur = end - start
            nb = r.sent + r.recv
            tracks.append(assign(lanes, start, end, j, out.tracks))
            names.append(r.cmd)
            starts.append(start)
            durs.append(dur)
            all_args.append(
                {
                    "device": label,
                    "phase": phase,
                    "tensor": r.tensor,
                    "bytes": r.bytes,
                    "sent": r.sent,
                    "recv": r.recv,
                    "queued_ns": start - r.queue,
                    # as dt.transfer_args: dt.bandwidth, in MB/s
                    "mb_per_s": round(nb * 1e9 / dur / 1e6, 3) if dur > 0 else 0.0,
                }
            )
        return out

    def _lanes(self, device: int, label: str) -> Lanes:
        assert self.network is not None
        return self.lanes.get(
            ("net", device), f"network: {label}", self.lanes.rank(device), self.network.uuid
        )

    def _command(self, phase: str, r: TransferRow) -> Iterator[Item]:
        assert self.network is not None
        dev = self.lanes.devs[r.device]
        lanes = self._lanes(r.device, dev.label)
        args = {"device": dev.label, "phase": phase, **dt.transfer_args(r)}
        yield from self.lanes.place(
            lanes, Slice(0, r.cmd, r.start, r.end - r.start, 0, "transfer", args)
        )
