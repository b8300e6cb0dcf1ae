"""What the devices of a run timed themselves, for ``devices.DeviceTracks``: a Vulkan device's
command buffers (``busy`` rows) and the graphs RPC servers computed (``remote`` rows), each on its
device's own-timing track, a compute's rows as one ``SliceRows``."""

from __future__ import annotations

from typing import Any

from ..reading.decode.devices import Placement
from ..session import device_time as dt
from .device_lanes import DeviceLanes, Lanes
from .items import SliceRows


class OwnTiming:
    """A session's own-timing tracks (``NAME command buffers``, ``NAME graphs``) and their rows."""

    def __init__(self, devs: dt.Devices, lanes: DeviceLanes) -> None:
        self.devs = devs
        self.lanes = lanes
        # ("busy" or "remote", device) -> its name (busy) or label (remote), and its lanes
        self.tracks: dict[tuple[str, int], tuple[str, Lanes]] = {}

    def _lanes(self, kind: str, d: int) -> tuple[str, Lanes]:
        got = self.tracks.get((kind, d))
        if got is None:
            dev = self.devs[d]
            title = f"{dev.name} command buffers" if kind == "busy" else f"{dev.name} graphs"
            lanes = self.lanes.get((kind, d), title, self.lanes.rank(d) + 1)
            got = self.tracks[(kind, d)] = (dev.name if kind == "busy" else dev.label, lanes)
        return got

    def busy(self, p: Placement, flow_of: dict[int, int]) -> SliceRows:
        """A compute's command buffers (the first of a split a device timed ends its flow)."""
        splits = p.splits
        seen: set[int] = set()
        last: dict[int, int] = {}
        out = SliceRows("busy", 0)
        for j, b in enumerate(sorted(p.busy, key=lambda x: (x.start, x.dur))):
            name, lanes = self._lanes("busy", b.device)
            args: dict[str, Any] = {"split": b.split, "n_ops": b.n_ops, "device": name}
            if b.device in last:
                args["idle_before_ns"] = max(0, b.start - last[b.device])
            if 0 <= b.split < len(splits):
                args["since_launch_ns"] = b.start - splits[b.split].launch
            last[b.device] = max(last.get(b.device, 0), b.start + b.dur)
            if b.split in flow_of and b.split not in seen:
                seen.add(b.split)
                out.flows_in[j] = (flow_of[b.split],)
            track = self.lanes.assign(lanes, b.start, b.start + b.dur, j, out.tracks)
            out.add(track, "command buffer", b.start, b.dur, args)
        return out

    def remote(self, p: Placement, flow_of: dict[int, int]) -> SliceRows:
        """A compute's graphs RPC servers timed (the first of a split ends its flow)."""
        splits = p.splits
        seen: set[int] = set()
        out = SliceRows("remote", 0)
        for j, r in enumerate(sorted(p.remote, key=lambda x: (x.start, x.end))):
            label, lanes = self._lanes("remote", r.device)
            args: dict[str, Any] = {
                "split": r.split,
                "device": label,
                "n_ops": r.n_ops,
                "bytes": r.bytes,
                "one_way_ns": r.one_way,
                "err_ns": r.err,
                "clock_offset_ns": r.clock_offset,
                "sent_to_start_ns": r.start - r.send,
                "end_to_reply_ns": r.reply - r.end,
            }
            if 0 <= r.split < len(splits):
                args["since_launch_ns"] = r.start - splits[r.split].launch
            if r.split in flow_of and r.split not in seen:
                seen.add(r.split)
                out.flows_in[j] = (flow_of[r.split],)
            track = self.lanes.assign(lanes, r.start, r.end, j, out.tracks)
            out.add(track, "graph compute (server)", r.start, r.end - r.start, args)
        return out
