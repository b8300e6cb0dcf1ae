"""The trace of a run on several devices: a track per device, the scheduler's splits, copies and
the network, laid out for ``layout.SessionLayout`` when the session's machine lists more than
one device (``device_time.multi_device``; a CPU-only log has none of these tracks).

Per session, besides the ``decode steps`` track:

* ``decode steps``: each step (spanning what it waited for: an RPC server may still compute after
  ``llama_decode`` returned; ``llama_decode_ns`` in its args), each compute, and inside it the
  scheduler's splits as the host ran them (``split K DEVICE``: from its input copies through
  handing its graph to the device until the device returned it). A split a device timed itself
  starts a flow to where the device ran it.
* one track per device (``CPU``, ``Vulkan0``, ``RPC0 HOST:PORT``): per compute, the device's part
  (``compute ubatch K``), its layer spans and its ops, as the device (or the RPC server) timed
  them, on the log's clock.
* ``Vulkan0 command buffers``: the stretches the device was busy (the flow from its split ends at
  the first); the gaps between are the device waiting on the host. ``RPC0 graphs``: each graph
  the server computed, as it timed it (the one-way network estimate and the placement's
  uncertainty in its args).
* ``copies``: each tensor the scheduler copied between devices (direction, bytes, rate).
* ``network``: a track per RPC server with every command sent to it (the model's upload first),
  its bytes and the rate achieved.

Slices that may overlap on one track (they should not, but a log is data) go to further lanes,
``NAME (2)``... A ``device_time.Devices`` names the devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

from ..reading.decode.columns import LayerSpan
from ..reading.decode.computes import Compute, OpTiming
from ..reading.decode.passes import Pass
from ..reading.decode.sessions import SessionInfo
from ..session import device_time as dt
from ..session.kv_flows import OpFlows
from .device_lanes import COPIES_ORDER, DeviceLanes, Lanes
from .device_own import OwnTiming
from .device_plan import Plan, Plans
from .items import BulkItem, ComputeBatch, Item, LayoutStats, Slice, SliceRows, Track, text_uuid
from .network import NetworkTracks
from .op_args import mb_per_s
from .op_slices import OpSlices


class SessionLayout(Protocol):
    """What the device tracks need of the session's layout (``layout.SessionLayout``, which
    makes a ``DeviceTracks`` of itself): its session, its process track, and the compute slices
    and batches it lays out the same way on every track (and the op slices one by one)."""

    info: SessionInfo
    pid: int
    process: Track
    bulk: bool
    per_op: OpSlices

    def compute_slice(self, c: Compute, track: int) -> Slice: ...

    def compute_batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
        run: slice | None = None,
    ) -> Iterator[BulkItem]: ...

    def batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
        run: slice | None = None,
        n_mask: int = -1,
        per_op: bool | None = None,
    ) -> tuple[ComputeBatch, list[tuple[int, OpTiming]]]: ...


class DeviceTracks:
    """One session's device tracks and what goes on them (see the module doc). Every step reads
    its placement's rows as read (``Placement.bulk``, times relative to its ``t0``), and what the
    steps repeat is made once (``device_plan``)."""

    def __init__(self, lay: SessionLayout) -> None:
        self.lay = lay
        self.devs = dt.Devices(lay.info)
        self.sid = lay.info.sid
        self.lanes = DeviceLanes(self.sid, lay.process, self.devs, lay.bulk)
        self.network = NetworkTracks(lay.info, self.lanes)
        self.pairs: dict[tuple[int, int], tuple[str, str, str]] = {}  # (``copy_rows``)
        self.plans = Plans(self.devs.cpu)
        self.own = OwnTiming(self.devs, self.lanes)
        self.parts: dict[int, tuple[int, str]] = {}  # device -> its track and label (parts)
        self.part_names: dict[int | None, str] = {}  # ubatch -> its parts' name

    # -- steps

    def step_end(self, step: Pass) -> int:
        """Where the step's slice ends: the last thing it waited for (``device_time``)."""
        return dt.step_window(step)[1]

    def compute(
        self, c: Compute, track: int, stats: LayoutStats, flows: OpFlows, step: Pass
    ) -> list[BulkItem]:
        """A compute on several devices: its slice and splits on the steps track, each device's
        part on its own track, then its copies and the devices' own timing (a list: a dozen
        items, no generator to resume for each)."""
        stats.computes += 1
        head = self.lay.compute_slice(c, track)
        p = c.place
        if p is None:
            out: list[BulkItem] = [head]
            out += self._parts(c, self.plans.get(c, []), stats, flows)
            return out
        (sp, cps, bs, rs), t0 = p.bulk()
        _widen(head, sp, bs, rs, t0)
        out = [head]
        started = _device_starts(bs, rs) if bs or rs else {}
        flow_of = self._flows(started, c, step) if started else {}
        plan = self.plans.get(c, sp)
        # the copies first (drawn after the parts): each split's count and bytes of them
        copied = [0] * (2 * len(sp))
        lanes = self.lanes.get(("copies",), "copies", COPIES_ORDER)
        copies = (
            copy_rows(cps, t0, self.lanes, lanes, self.pairs, self.devs, copied) if cps else None
        )
        if sp:
            out += self._splits(sp, copied, started, t0, track, flow_of, plan)
        out += self._parts(c, plan, stats, flows)
        # (none made for a kind of rows the compute has none of: most have one or two)
        bulk = self.lay.bulk
        if copies is not None:
            out += as_items(copies, bulk)
        if bs:
            out += as_items(self.own.busy(bs, sp, t0, flow_of), bulk)
        if rs:
            out += as_items(self.own.remote(rs, sp, t0, flow_of), bulk)
        return out

    def _parts(self, c: Compute, plan: Plan, stats: LayoutStats, flows: OpFlows) -> list[BulkItem]:
        """Each device's part of the compute ``c`` on its own track (the track first, where it
        is new): its slice, layer spans and ops."""
        out: list[BulkItem] = []
        lo_g, hi_g = op_bounds(c, plan) if len(c.op_node) else ([], [])
        layers = c.layers
        lay = self.lay
        name = self.part_names.get(c.ubatch)
        if name is None:
            name = self.part_names[c.ubatch] = f"compute ubatch {c.ubatch}"
        bulk = lay.bulk
        per_op: bool | None = None  # (``c.per_op``, asked once)
        for part in plan.parts:
            d = part.device
            got = self.parts.get(d)
            if got is None:
                out += self.lanes.device_track(d)
                got = self.parts[d] = (self.lanes.track_of(d), self.devs[d].label)
            idx = part.spans
            spans = layers[idx] if type(idx) is slice else [layers[i] for i in idx]
            g = part.group
            if g >= 0 and lo_g:
                head_d = _device_slice(c, got, spans, part.n_ops, lo_g[g], hi_g[g], name)
            else:
                head_d = _device_slice(c, got, spans, 0, 0, 0, name)
            if head_d is None:
                continue
            if bulk:  # (the batch as a pair: no generator per part)
                if per_op is None:
                    per_op = c.per_op
                cb, ops = lay.batch(
                    head_d, c, spans, stats, flows, part.mask, part.run, part.n_ops, per_op
                )
                out.append(cb)
                if ops:
                    out += lay.per_op.op_list(ops, c, head_d.track, stats, flows)
            else:
                out += lay.compute_batch(head_d, c, spans, stats, flows, part.mask, part.run)
        return out

    def _flows(self, started: dict[int, int], c: Compute, step: Pass) -> dict[int, int]:
        """A flow id per split that a device timed itself (from the host's launch to the device):
        those of ``started`` (``_device_starts``), but -1 (no split)."""
        # track_uuid(sid, "launch", ctx, step, ubatch, k), the prefix joined once
        pre = f"{self.sid}\0launch\0{step.ctx}\0{step.index}\0{c.ubatch}\0"
        out: dict[int, int] = {}
        for k in sorted(started):
            if k >= 0:
                out[k] = text_uuid(pre + str(k))
        return out

    def _splits(
        self,
        sp: list[Any],
        copied: list[int],
        started: dict[int, int],
        t0: int,
        track: int,
        flow_of: dict[int, int],
        plan: Plan,
    ) -> list[Slice]:
        """The splits' slices (rows relative to ``t0``): each with its copies' count and bytes
        (``copied``: split K's at 2K and 2K + 1), and when its device began it, if the device
        timed it (``started``: ``_device_starts``)."""
        texts = plan.texts
        if texts is None:  # (the plan's splits are these rows' devices and node ranges)
            texts = plan.texts = [
                (self.devs[d].label, f"split {k} {self.devs[d].name}", f"{i0}..{i1}")
                for k, (d, i0, i1, *_) in enumerate(sp)
            ]
        out = []
        for k, (_, _, _, s, la, e) in enumerate(sp):
            label, name, nodes = texts[k]
            args: dict[str, Any] = {
                "split": k,
                "device": label,
                "nodes": nodes,
                "inputs_ns": la - s,
                "launch_ns": e - la,
                "n_copies": copied[2 * k],
                "copy_bytes": copied[2 * k + 1],
            }
            if k in started:  # the gap: host launch to device
                args["device_start_ns"] = started[k] - la
            flow = flow_of.get(k)
            out.append(Slice(track, name, t0 + s, e - s, 2, "split", args, (flow,) if flow else ()))
        return out

    def transfers(self, step: Pass | None = None) -> list[Item | SliceRows]:
        """The RPC commands of ``step``, or (None) those outside any step not drawn yet."""
        return self.network.transfers(step)


def _widen(head: Slice, sp: list[Any], bs: list[Any], rs: list[Any], t0: int) -> None:
    """Widen a compute's slice to its splits, its devices' busy stretches and its remote graphs
    (rows relative to ``t0``)."""
    lo, hi = head.ts - t0, head.ts + head.dur - t0  # (relative to t0, as the rows)
    for s in sp:
        if s[3] < lo:
            lo = s[3]
        if s[5] > hi:
            hi = s[5]
    for r in rs:
        if r[5] > hi:
            hi = r[5]
    for b in bs:
        if b[1] + b[2] > hi:
            hi = b[1] + b[2]
    head.ts, head.dur = t0 + lo, hi - lo


def _device_starts(bs: list[Any], rs: list[Any]) -> dict[int, int]:
    """When each split's device began it, of the splits a device timed: its first busy or
    remote row's start (rows relative to the compute's ``t0``; split -1 among them, if any)."""
    started: dict[int, int] = {}
    for b in bs:
        k, t = b[3], b[1]
        if k not in started or t < started[k]:
            started[k] = t
    for r in rs:
        k, t = r[0], r[4]
        if k not in started or t < started[k]:
            started[k] = t
    return started


def _device_slice(
    c: Compute,
    got: tuple[int, str],
    spans: Sequence[LayerSpan],
    n_ops: int,
    lo: int,
    hi: int,
    name: str,
) -> Slice | None:
    """A device's part of ``c`` on its track (``got``: the track and the device's label), named
    ``name``: from its first layer or op to its last (``n_ops``: its ops' count, ``lo`` and
    ``hi`` their first start and last end when there are some, ``op_bounds``)."""
    if spans:
        if not n_ops:
            lo, hi = spans[0].start, spans[0].start + spans[0].dur
        for _, s, d, _ in spans:  # (a plain loop: cheaper than map passes at a dozen spans)
            if s < lo:
                lo = s
            if s + d > hi:
                hi = s + d
    elif not n_ops:
        return None
    g = c.graph
    args = {"ubatch": c.ubatch, "graph": g.id if g else -1, "device": got[1], "n_ops": n_ops}
    return Slice(got[0], name, lo, hi - lo, 1, "device", args)


def as_items(rows: SliceRows, bulk: bool) -> list[Item | SliceRows]:
    """``rows`` as one item (``bulk``: ``layout_bulk``), or one by one (none if empty)."""
    if not rows.ts:
        return []
    return [rows] if bulk else list(rows.items())


def op_bounds(c: Compute, plan: Plan) -> tuple[list[int], list[int]]:
    """Per device with ops in ``c`` (in the plan's ``counts``' order): their first start and
    last end (each run's in one ``reduceat``, then per device)."""
    st, du = np.asarray(c.op_start), np.asarray(c.op_dur)
    if st.dtype == object or du.dtype == object:  # (times past 2**62: Python ints)
        lo_of: dict[int, int] = {}
        hi_of: dict[int, int] = {}
        for d, s, u in zip(plan.devices.tolist(), st.tolist(), du.tolist(), strict=True):
            lo_of[d] = min(lo_of.get(d, s), s)
            hi_of[d] = max(hi_of.get(d, s + u), s + u)
        uniq = sorted(lo_of)
        return [lo_of[d] for d in uniq], [hi_of[d] for d in uniq]
    runs = plan.runs
    lo = np.minimum.reduceat(st, runs).tolist()
    hi = np.maximum.reduceat(st + du, runs).tolist()
    rg = plan.run_group
    if rg is plan.in_order:  # (a run per device, in the devices' order)
        return lo, hi
    n = len(plan.counts)
    if len(rg) == n:  # (a run per device: nearly always)
        lo_g: list[Any] = [None] * n
        hi_g: list[Any] = [None] * n
        for g, a, z in zip(rg, lo, hi, strict=True):
            lo_g[g] = a
            hi_g[g] = z
        return lo_g, hi_g
    ext: dict[int, tuple[int, int]] = {}
    for g, a, z in zip(rg, lo, hi, strict=True):
        a0, z0 = ext.get(g, (a, z))
        ext[g] = (min(a0, a), max(z0, z))
    return [ext[g][0] for g in range(n)], [ext[g][1] for g in range(n)]


def copy_rows(
    cps: list[Any],
    t0: int,
    dl: DeviceLanes,
    lanes: Lanes,
    pairs: dict[tuple[int, int], tuple[str, str, str]],
    devs: dt.Devices,
    copied: list[int],
) -> SliceRows:
    """The copies of a compute (its ``copies`` rows, times relative to ``t0``), as
    ``DeviceTracks`` draws them (``pairs``: per source and destination device, their names and
    the slices' name, filled as met); each split's count and bytes of them added to ``copied``
    (split K's at 2K and 2K + 1; a copies row's split is one of the compute's)."""
    out = SliceRows("copy", 0)
    if not cps:
        return out
    # (SliceRows.add, inlined: a few rows per compute)
    tracks, labels, starts, durs, all_args = out.track, out.name, out.ts, out.dur, out.args
    ends = lanes.ends
    # (rows come in runs of a pair of devices, and of a split: the pair's names looked up, and
    # the split's count and bytes added, once a run)
    last_src = last_dst = -2
    src = dst = label = ""
    cur_k, n_k, b_k = -1, 0, 0
    uuid0 = lanes.uuids[0] if lanes.uuids else 0  # (its first lane's, once made)
    for k, node, tensor, nbytes, src_d, dst_d, s, dur in sorted(cps, key=_COPY_ORDER):
        if src_d != last_src or dst_d != last_dst:
            last_src, last_dst = src_d, dst_d
            got = pairs.get((src_d, dst_d))
            if got is None:
                src, dst = devs[src_d].name, devs[dst_d].name
                got = pairs[(src_d, dst_d)] = (src, dst, f"{src} → {dst}")
            src, dst, label = got
        if k != cur_k:
            if n_k:
                copied[2 * cur_k] += n_k
                copied[2 * cur_k + 1] += b_k
            cur_k, n_k, b_k = k, 0, 0
        n_k += 1
        b_k += nbytes
        start = t0 + s
        if ends and ends[0] <= start:  # (``assign``'s first lane, inlined: nearly every row's)
            ends[0] = start + dur
            tracks.append(uuid0)
        else:
            tracks.append(dl.assign(lanes, start, start + dur, len(tracks), out.tracks))
            uuid0 = lanes.uuids[0]
        labels.append(label)
        starts.append(start)
        durs.append(dur)
        all_args.append(
            {
                "tensor": tensor,
                "bytes": nbytes,
                "from": src,
                "to": dst,
                "split": k,
                "node": node,
                # as dt.bandwidth, in MB/s
                "mb_per_s": mb_per_s(nbytes, dur),
            }
        )
    if n_k:
        copied[2 * cur_k] += n_k
        copied[2 * cur_k + 1] += b_k
    return out


_COPY_ORDER = itemgetter(6, 7)  # a copies row's start and duration
