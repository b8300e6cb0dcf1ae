"""The trace of a run on several devices: a track per device, the scheduler's splits, copies and
the network, laid out for ``layout.SessionLayout`` when the session's machine lists more than
one device (``device_time.multi_device``; a CPU-only log is laid out as before).

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
from typing import Any, Protocol

import numpy as np

from ..reading.decode.columns import LayerSpan
from ..reading.decode.computes import Compute
from ..reading.decode.devices import Placement, Split
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..session import device_time as dt
from ..session.kv_flows import OpFlows
from .device_lanes import COPIES_ORDER, DeviceLanes, Lanes
from .device_own import OwnTiming
from .items import BulkItem, Item, LayoutStats, Slice, SliceRows, Track, track_uuid
from .network import NetworkTracks


class SessionLayout(Protocol):
    """What the device tracks need of the session's layout (``layout.SessionLayout``, which
    makes a ``DeviceTracks`` of itself): its session, its process track, and the compute slices
    and batches it lays out the same way on every track."""

    info: SessionInfo
    pid: int
    process: Track
    bulk: bool

    def compute_slice(self, c: Compute, track: int) -> Slice: ...

    def compute_batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
    ) -> Iterator[BulkItem]: ...


class DeviceTracks:
    """One session's device tracks and what goes on them (see the module doc)."""

    def __init__(self, lay: SessionLayout) -> None:
        self.lay = lay
        self.devs = dt.Devices(lay.info)
        self.sid = lay.info.sid
        self.lanes = DeviceLanes(self.sid, lay.process, self.devs, lay.bulk)
        self.network = NetworkTracks(lay.info, self.lanes)
        self.names: dict[int, str] = {}  # device names by index (``copy_rows``)
        self.plans: dict[tuple[Any, ...], list[tuple[int, list[int]]]] = {}  # (``_plan``)
        self.own = OwnTiming(self.devs, self.lanes)

    # -- steps

    def step_end(self, step: Step) -> int:
        """Where the step's slice ends: the last thing it waited for (``device_time``)."""
        return dt.step_window(step)[1]

    def compute(
        self, c: Compute, track: int, stats: LayoutStats, flows: OpFlows, step: Step
    ) -> Iterator[BulkItem]:
        """A compute on several devices: its slice and splits on the steps track, each device's
        part on its own track, then its copies and the devices' own timing."""
        stats.computes += 1
        head = self.lay.compute_slice(c, track)
        p = c.place
        lo, hi = head.ts, head.ts + head.dur
        if p is not None:
            for s in p.splits:
                lo, hi = min(lo, s.start), max(hi, s.end)
            for r in p.remote:
                hi = max(hi, r.end)
            for b in p.busy:
                hi = max(hi, b.start + b.dur)
        head.ts, head.dur = lo, hi - lo
        yield head
        flow_of = self._flows(c, step)
        if p is not None and p.splits:
            copied, started = _per_split(p)
            for k, s in enumerate(p.splits):
                yield self._split(
                    k, s, copied.get(k, (0, 0)), started.get(k), track, flow_of.get(k)
                )
        cpu = self.devs.cpu
        has_ops = len(c.op_node) > 0
        extents = op_extents(c, cpu) if has_ops else {}
        masks = dt.op_masks(c, cpu) if has_ops else {}
        layers = c.layers
        for d, idx in self._plan(c, cpu):
            yield from self.lanes.device_track(d)
            spans = [layers[i] for i in idx]
            mask = masks.get(d) if has_ops else None
            if mask is None and has_ops:  # (a device with layers only: no op)
                mask = dt.op_devices(c, cpu) == d
            head_d = self._device_slice(c, d, spans, extents.get(d, (0, 0, 0)))
            if head_d is not None:
                yield from self.lay.compute_batch(head_d, c, spans, stats, flows, mask)
        if p is not None:
            yield from self._copies(c)
            yield from as_items(self.own.busy(p, flow_of), self.lay.bulk)
            yield from as_items(self.own.remote(p, flow_of), self.lay.bulk)

    def _plan(self, c: Compute, cpu: int) -> list[tuple[int, list[int]]]:
        """The devices a compute ran on (``device_time.compute_devices``), each with the
        positions of its layer spans: made once per splits and layer devices (every generation
        step repeats them)."""
        splits = c.place.splits if c.place is not None else []
        ld = c.layer_device
        key = (
            tuple(s.device for s in splits),
            len(c.layers),
            ld.tobytes() if ld is not None else None,
        )
        plan = self.plans.get(key)
        if plan is None:
            lds = dt.layer_devices(c, cpu).tolist()
            plan = [
                (d, [i for i, x in enumerate(lds) if x == d]) for d in dt.compute_devices(c, cpu)
            ]
            if len(self.plans) >= 256:
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def _device_slice(
        self, c: Compute, d: int, spans: list[Any], ops: tuple[int, int, int]
    ) -> Slice | None:
        """Device ``d``'s part of ``c``: from its first layer or op to its last (``ops``: its
        ops' count, first start and last end, ``op_extents``)."""
        starts = [s.start for s in spans]
        ends = [s.start + s.dur for s in spans]
        n_ops = ops[0]
        if n_ops:
            starts.append(ops[1])
            ends.append(ops[2])
        if not starts:
            return None
        args = {
            "ubatch": c.ubatch,
            "graph": c.graph.id if c.graph else -1,
            "device": self.devs[d].label,
            "n_ops": n_ops,
        }
        lo = min(starts)
        return Slice(
            self.lanes.track_of(d),
            f"compute ubatch {c.ubatch}",
            lo,
            max(ends) - lo,
            1,
            "device",
            args,
        )

    def _flows(self, c: Compute, step: Step) -> dict[int, int]:
        """A flow id per split that a device timed itself (from the host's launch to the device)."""
        p = c.place
        if p is None:
            return {}
        timed = {b.split for b in p.busy} | {r.split for r in p.remote}
        return {
            k: track_uuid(self.sid, "launch", step.ctx, step.index, c.ubatch, k)
            for k in sorted(timed)
            if k >= 0
        }

    def _split(
        self,
        k: int,
        s: Split,
        copied: tuple[int, int],
        started: int | None,
        track: int,
        flow: int | None,
    ) -> Slice:
        """Split ``k``'s slice (``copied``: its copies' count and bytes; ``started``: when its
        device began it, if the device timed it: ``_per_split``)."""
        dev = self.devs[s.device]
        args: dict[str, Any] = {
            "split": k,
            "device": dev.label,
            "nodes": f"{s.i_start}..{s.i_end}",
            "inputs_ns": s.launch - s.start,
            "launch_ns": s.end - s.launch,
            "n_copies": copied[0],
            "copy_bytes": copied[1],
        }
        if started is not None:
            args["device_start_ns"] = started - s.launch  # the gap: host launch to device
        name = f"split {k} {dev.name}"
        return Slice(
            track, name, s.start, s.end - s.start, 2, "split", args, (flow,) if flow else ()
        )

    def _copies(self, c: Compute) -> Iterator[Item | SliceRows]:
        p = c.place
        assert p is not None
        lanes = self.lanes.get(("copies",), "copies", COPIES_ORDER)
        yield from as_items(copy_rows(p, self.lanes, lanes, self.names, self.devs), self.lay.bulk)

    def transfers(self, step: Step | None = None) -> Iterator[Item | SliceRows]:
        """The RPC commands of ``step``, or (None) those outside any step not drawn yet."""
        return self.network.transfers(step)


def as_items(rows: SliceRows, bulk: bool) -> Iterator[Item | SliceRows]:
    """``rows`` as one item (``bulk``: ``layout_bulk``), or one by one (none if empty)."""
    if not rows.ts:
        return
    if bulk:
        yield rows
    else:
        yield from rows.items()


def op_extents(c: Compute, cpu: int) -> dict[int, tuple[int, int, int]]:
    """Per device with ops in ``c``: their count, first start and last end (the ops grouped
    by device once per graph and splits: ``device_time.op_groups``)."""
    uniq, counts, order, starts = dt.op_groups(c, cpu)
    st, du = np.asarray(c.op_start), np.asarray(c.op_dur)
    if st.dtype == object or du.dtype == object:  # (times past 2**62: Python ints)
        od = dt.op_devices(c, cpu).tolist()
        lo_of: dict[int, int] = {}
        hi_of: dict[int, int] = {}
        for d, s, u in zip(od, st.tolist(), du.tolist(), strict=True):
            lo_of[d] = min(lo_of.get(d, s), s)
            hi_of[d] = max(hi_of.get(d, s + u), s + u)
        return {d: (k, lo_of[d], hi_of[d]) for d, k in zip(uniq, counts, strict=True)}
    s_o = st[order]
    lo = np.minimum.reduceat(s_o, starts).tolist()
    hi = np.maximum.reduceat(s_o + du[order], starts).tolist()
    return {d: (k, a, z) for d, k, a, z in zip(uniq, counts, lo, hi, strict=True)}


def _per_split(p: Placement) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """Per split: its copies' count and bytes, and the first start of the work its device timed
    (command buffers, remote graphs), in one pass over each list."""
    copied: dict[int, tuple[int, int]] = {}
    for cp in p.copies:
        n, b = copied.get(cp.split, (0, 0))
        copied[cp.split] = (n + 1, b + cp.bytes)
    started: dict[int, int] = {}
    for k, t in [(b.split, b.start) for b in p.busy] + [(r.split, r.start) for r in p.remote]:
        if k not in started or t < started[k]:
            started[k] = t
    return copied, started


def copy_rows(
    p: Placement, dl: DeviceLanes, lanes: Lanes, names: dict[int, str], devs: dt.Devices
) -> SliceRows:
    """The copies of a compute, as ``DeviceTracks`` draws them (``names``: device names by
    index, filled as met)."""
    out = SliceRows("copy", 0)
    assign = dl.assign
    # (SliceRows.add, inlined: a few rows per compute)
    tracks, labels, starts, durs, all_args = out.track, out.name, out.ts, out.dur, out.args
    for j, cp in enumerate(sorted(p.copies, key=lambda x: (x.start, x.dur))):
        src = names.get(cp.src) or names.setdefault(cp.src, devs[cp.src].name)
        dst = names.get(cp.dst) or names.setdefault(cp.dst, devs[cp.dst].name)
        start, dur = cp.start, cp.dur
        # as dt.bandwidth, in MB/s
        mb_s = round(cp.bytes * 1e9 / dur / 1e6, 3) if dur > 0 else 0.0
        all_args.append(
            {
                "tensor": cp.name,
                "bytes": cp.bytes,
                "from": src,
                "to": dst,
                "split": cp.split,
                "node": cp.node,
                "mb_per_s": mb_s,
            }
        )
        tracks.append(assign(lanes, start, start + dur, j, out.tracks))
        labels.append(f"{src} → {dst}")
        starts.append(start)
        durs.append(dur)
    return out
