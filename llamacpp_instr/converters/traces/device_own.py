"""What the devices of a run timed themselves, for ``devices.DeviceTracks``: a Vulkan device's
command buffers (``busy`` rows) and the graphs RPC servers computed (``remote`` rows), each on its
device's own-timing track, a compute's rows as one ``SliceRows``. The rows are a ``Placement``'s
as read (``Placement.bulk``: ``Busy``'s and ``Remote``'s fields, times relative to ``t0``)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from ..session import device_time as dt
from .device_lanes import NO_LANES, DeviceLanes, Lanes
from .items import SliceRows

_BUSY_ORDER = itemgetter(1, 2)  # a busy row's start and duration
_REMOTE_ORDER = itemgetter(4, 5)  # a remote row's start and end


class OwnTiming:
    """A session's own-timing tracks (``NAME command buffers``, ``NAME graphs``) and their rows."""

    def __init__(self, devs: dt.Devices, lanes: DeviceLanes) -> None:
        self.devs = devs
        self.lanes = lanes
        # per device, its name (busy) or label (remote), and its lanes
        self.busy_of: dict[int, tuple[str, Lanes]] = {}
        self.remote_of: dict[int, tuple[str, Lanes]] = {}

    def _lanes(self, kind: str, d: int) -> tuple[str, Lanes]:
        """Device ``d``'s own-timing track of ``kind`` ("busy" or "remote"), made when first met."""
        dev = self.devs[d]
        title = f"{dev.name} command buffers" if kind == "busy" else f"{dev.name} graphs"
        lanes = self.lanes.get((kind, d), title, self.lanes.rank(d) + 1)
        if kind == "busy":
            got = self.busy_of[d] = (dev.name, lanes)
        else:
            got = self.remote_of[d] = (dev.label, lanes)
        return got

    def busy(self, bs: list[Any], sp: list[Any], t0: int, flow_of: dict[int, int]) -> SliceRows:
        """A compute's command buffers (``bs``; ``sp``: its splits rows): the first of a split
        a device timed ends its flow."""
        out = SliceRows("busy", 0)
        if not bs:
            return out
        n_splits = len(sp)
        seen: set[int] = set()
        last: dict[int, int] = {}
        of = self.busy_of
        # (SliceRows.add, inlined: a few rows per compute)
        tracks, starts, durs, all_args = out.track, out.ts, out.dur, out.args
        # (a device's rows come in runs: its name, lanes and last end kept through each)
        last_d: int | None = None
        prev: int | None = None
        name, lanes = "", NO_LANES
        ends = lanes.ends
        for j, (d, s, dur, k, n_ops) in enumerate(sorted(bs, key=_BUSY_ORDER)):
            if d != last_d:
                if last_d is not None and prev is not None:
                    last[last_d] = prev
                got = of.get(d)
                if got is None:
                    got = self._lanes("busy", d)
                name, lanes = got
                ends = lanes.ends
                prev = last.get(d)
                last_d = d
            start = t0 + s
            end = start + dur
            if prev is not None:  # (max() spelt out: a few rows a step)
                idle = start - prev if start > prev else 0
                if end > prev:
                    prev = end
                if 0 <= k < n_splits:  # (the usual: every key in one literal)
                    args: dict[str, Any] = {
                        "split": k,
                        "n_ops": n_ops,
                        "device": name,
                        "idle_before_ns": idle,
                        "since_launch_ns": s - sp[k][4],
                    }
                else:
                    args = {"split": k, "n_ops": n_ops, "device": name, "idle_before_ns": idle}
            else:
                prev = end if end > 0 else 0
                args = {"split": k, "n_ops": n_ops, "device": name}
                if 0 <= k < n_splits:
                    args["since_launch_ns"] = s - sp[k][4]
            if k in flow_of and k not in seen:
                seen.add(k)
                out.flows_in[j] = (flow_of[k],)
            if ends and ends[0] <= start:  # (``assign``'s first lane, inlined: nearly all)
                ends[0] = end
                tracks.append(lanes.uuids[0])
            else:
                tracks.append(self.lanes.assign(lanes, start, end, j, out.tracks))
            starts.append(start)
            durs.append(dur)
            all_args.append(args)
        out.name = ["command buffer"] * len(tracks)
        return out

    def remote(self, rs: list[Any], sp: list[Any], t0: int, flow_of: dict[int, int]) -> SliceRows:
        """A compute's graphs RPC servers timed (``rs``; ``sp``: its splits rows): the first of
        a split ends its flow."""
        out = SliceRows("remote", 0)
        if not rs:
            return out
        n_splits = len(sp)
        seen: set[int] = set()
        of = self.remote_of
        # (SliceRows.add, inlined: a few rows per compute)
        tracks, names, starts, durs, all_args = out.track, out.name, out.ts, out.dur, out.args
        for j, (k, d, send, reply, s, e, one_way, err, offset, nbytes, n_ops) in enumerate(
            sorted(rs, key=_REMOTE_ORDER)
        ):
            got = of.get(d)
            if got is None:
                got = self._lanes("remote", d)
            label, lanes = got
            args: dict[str, Any] = {
                "split": k,
                "device": label,
                "n_ops": n_ops,
                "bytes": nbytes,
                "one_way_ns": one_way,
                "err_ns": err,
                "clock_offset_ns": offset,
                "sent_to_start_ns": s - send,
                "end_to_reply_ns": reply - e,
            }
            if 0 <= k < n_splits:
                args["since_launch_ns"] = s - sp[k][4]
            if k in flow_of and k not in seen:
                seen.add(k)
                out.flows_in[j] = (flow_of[k],)
            start = t0 + s
            ends = lanes.ends
            if ends and ends[0] <= start:  # (``assign``'s first lane, inlined: nearly all)
                ends[0] = t0 + e
                tracks.append(lanes.uuids[0])
            else:
                tracks.append(self.lanes.assign(lanes, start, t0 + e, j, out.tracks))
            names.append("graph compute (server)")
            starts.append(start)
            durs.append(e - s)
            all_args.append(args)
        return out
