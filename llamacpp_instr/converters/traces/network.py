"""The ``network`` track of a run on RPC servers: a track per server with every command sent to it
(the model's upload first), its bytes and the rate achieved (``transfers`` records)."""

from __future__ import annotations

from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from ..reading.decode.passes import Pass
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.transfers import TransferRow
from ..session import device_time as dt
from .device_lanes import NETWORK_ORDER, NO_LANES, DeviceLanes, Lanes
from .items import Item, Slice, SliceRows, Track, track_uuid
from .op_args import mb_per_s

_ROW_ORDER = itemgetter(7, 9)  # a transfers row's start and end
_CMD = itemgetter(1)  # a transfers row's command


class NetworkTracks:
    """A session's network track and its per-server lanes."""

    def __init__(self, info: SessionInfo, lanes: DeviceLanes) -> None:
        self.info = info
        self.lanes = lanes
        self.network: Track | None = None
        self.transfers_done = 0
        self.labels: dict[int, tuple[str, Lanes]] = {}  # device -> its label and lanes

    def pending(self) -> bool:
        """Whether ``transfers`` records outside any step were read since the last call."""
        return self.transfers_done < len(self.info.transfers)

    def transfers(self, step: Pass | None = None) -> list[Item | SliceRows]:
        """The RPC commands of ``step``, or (None) those outside any step not drawn yet (a list:
        asked every step, and a generator's frame cost more than the usual none)."""
        if step is not None:
            blocks = step.transfers
        else:
            blocks = self.info.transfers[self.transfers_done :]
            self.transfers_done = len(self.info.transfers)
        if not blocks:
            return []
        # each block's rows as read (``Transfers.bulk_rows``: ``TransferRow``'s fields, times
        # relative to its offset), with its phase and offset
        parts: list[tuple[str, int, list[Any]]] = []
        for t in blocks:
            raw, t0 = t.bulk_rows()
            if raw:
                parts.append((t.phase, t0, raw))
        if not parts:
            return []
        out: list[Item | SliceRows] = []
        if self.network is None:
            self.network = Track(
                track_uuid(self.lanes.sid, "network"),
                "network",
                self.lanes.process.uuid,
                "slices",
                NETWORK_ORDER,
                self.lanes.process.pid,
            )
            out.append(self.network)
        if len(blocks) == 1:  # (one offset: the rows' own times order them)
            phase, t0, raw = parts[0]
            parts = [(phase, t0, sorted(raw, key=_ROW_ORDER))]
        else:  # (rows of several offsets: each row its own part, in absolute time order)
            rows = [(phase, t0, r) for phase, t0, raw in parts for r in raw]
            rows.sort(key=lambda x: (x[1] + x[2][7], x[1] + x[2][9]))
            parts = [(phase, t0, [r]) for phase, t0, r in rows]
        if self.lanes.bulk:
            out.append(self._commands(parts))
            return out
        for phase, t0, raw in parts:
            for r in raw:
                out += self._command(phase, TransferRow(*r[:6], *(t0 + v for v in r[6:])))
        return out

    def _commands(self, parts: list[tuple[str, int, list[Any]]]) -> SliceRows:
        """``_command`` for each row of ``parts`` (each a phase, an offset and its rows; all
        sorted), as one item."""
        out = SliceRows("transfer", 0)
        labels = self.labels
        assign = self.lanes.assign
        # (SliceRows.add, inlined: a few rows per op)
        tracks, starts, durs, all_args = out.track, out.ts, out.dur, out.args
        # (a server's commands come in runs: its label, lanes and first lane's id asked once a
        # run)
        last_d: int | None = None
        label, lanes = "", NO_LANES
        ends = lanes.ends
        uuid0 = 0
        for phase, t0, rows in parts:
            for d, _, tensor, nbytes, sent, recv, q, s, _, e in rows:
                if d != last_d:
                    got = labels.get(d)
                    if got is None:
                        label = self.lanes.devs[d].label
                        got = labels[d] = (label, self._lanes(d, label))
                    label, lanes = got
                    ends = lanes.ends
                    uuid0 = lanes.uuids[0] if lanes.uuids else 0
                    last_d = d
                start = t0 + s
                if ends and ends[0] <= start:  # (``assign``'s first lane, inlined: nearly all)
                    ends[0] = t0 + e
                    tracks.append(uuid0)
                else:
                    tracks.append(assign(lanes, start, t0 + e, len(tracks), out.tracks))
                    uuid0 = lanes.uuids[0]
                starts.append(start)
                dur = e - s
                durs.append(dur)
                all_args.append(
                    {
                        "device": label,
                        "phase": phase,
                        "tensor": tensor,
                        "bytes": nbytes,
                        "sent": sent,
                        "recv": recv,
                        "queued_ns": s - q,
                        # as dt.transfer_args: dt.bandwidth, in MB/s
                        "mb_per_s": mb_per_s(sent + recv, dur),
                    }
                )
        # (the commands' names at once: a C loop)
        if len(parts) == 1:
            out.name = list(map(_CMD, parts[0][2]))
        else:
            out.name = [r[1] for _, _, rows in parts for r in rows]
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
