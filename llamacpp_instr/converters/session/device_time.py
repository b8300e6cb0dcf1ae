"""Where a step's time goes per device: the figures every writer shows for runs on several
devices (a GPU through Vulkan, RPC servers), derived once from the session model.

A session is laid out by device when its machine lists more than one device
(``session_start.machine.devices``); a CPU-only log shows nothing of this (``multi_device``).

What ran where (``Devices``, ``op_devices``, ``layer_devices``): an op's device is the device of
the split holding its node (the CPU backend's when no split does); a layer span's is its fifth
element (the CPU backend's without one).

Per step and device (``step_time`` -> ``StepTime``), every figure from the log's own times, over
the step's window (from the step's start to the last of its end, its computes' ends and its
transfers' ends: an RPC server may still compute after ``llama_decode`` returned):

* ``compute_ns``: the device's own measure of its work, as a union of intervals: a Vulkan
  device's command buffers (``busy``), an RPC server's own graph computes (``remote``), the CPU
  backend's splits (it computes a split before returning it). A device with none of these (a
  stock RPC server, an asynchronous backend without its own timer) has ``timed`` False and no
  compute time: its split times are only launches.
* ``op_ns``/``n_ops``, ``layer_ns``/``layers``: its timed ops, and its layer spans.
* ``copy_in_bytes``/``copy_out_bytes``/``copy_ns``: the scheduler's copies into and out of it
  (host-side times of the copy calls).
* ``sent_bytes``/``recv_bytes``/``net_ns``/``n_cmds`` (RPC): the commands sent to its server
  (``transfers``), framing included; ``net_ns`` is the commands' time on the connection less the
  server's own compute within it (a read that waits for a graph is network only once the graph
  is done).
* ``outstanding_ns``: from handing each split to the device until it was done (its last command
  buffer or remote compute of the split, or the split's return), as a union; ``idle_ns`` is the
  part of it the device did not compute (waiting for the host, its submission or the network),
  ``gap_ns`` the part before the device started each split (host launch to device start);
  ``wait_ns`` is the client's wait: the device outstanding or its commands on the connection
  while the CPU backend computed nothing.
* ``share``: ``compute_ns`` over the step's window (shares of devices that compute at once add
  up to more than 1).

The step's window splits exclusively into ``compute_ns`` (any device computing), ``transfer_ns``
(data moving — RPC commands on a connection, the scheduler's copies — while no device computes:
the network's or the copies' own share) and ``host_ns`` (neither: launches, graph building,
sampling on the host).

``load_time`` gives the same transfer figures for the commands sent outside any step (the
model's upload), per device. ``transfer_bytes`` and ``transfer_ns`` (``DeviceStep``) are what a
device moved and how long: the RPC commands' bytes and network time for an RPC device, the copies'
bytes and time for any other. ``bottleneck`` says in a line or two what dominates a token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from ..reading.decode.computes import Compute
from ..reading.decode.passes import Pass
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..reading.decode.transfers import TransferRow, Transfers

Interval = tuple[int, int]


# --- devices ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """One device of ``session_start.machine.devices``."""

    index: int
    name: str  # ggml's: CPU, Vulkan0, RPC0 ...
    backend: str
    description: str  # an RPC server's HOST:PORT
    type: str  # cpu, gpu, ...
    remote_timing: bool | None = None  # RPC: its server times its graphs

    @property
    def is_rpc(self) -> bool:
        return self.backend == "RPC"

    @property
    def label(self) -> str:
        """How the trace and reports name it: ``Vulkan0``, ``RPC0 10.0.0.2:50052``."""
        return f"{self.name} {self.description}" if self.is_rpc and self.description else self.name


class Devices:
    """The devices a session names by index, the CPU backend's among them (``cpu``)."""

    def __init__(self, info: SessionInfo) -> None:
        listed = info.machine.get("devices") if isinstance(info.machine, dict) else None
        self.known: dict[int, Device] = {}
        for k, d in enumerate(listed if isinstance(listed, list) else []):
            if not isinstance(d, dict):
                continue
            index = d.get("index", k)
            index = index if type(index) is int else k
            rt = d.get("remote_timing")
            self.known.setdefault(
                index,
                Device(
                    index,
                    str(d.get("name") or f"device {index}"),
                    str(d.get("backend") or ""),
                    str(d.get("description") or ""),
                    str(d.get("type") or ""),
                    rt if isinstance(rt, bool) else None,
                ),
            )
        cpus = [d.index for d in self.known.values() if d.backend == "CPU"]
        self.cpu = cpus[0] if cpus else -1

    def __getitem__(self, index: int) -> Device:
        d = self.known.get(index)
        if d is None:  # a device the list does not name (-1: not in ggml's registry yet)
            name = "CPU" if index == self.cpu else f"device {index}"
            d = Device(index, name, "CPU" if index == self.cpu else "", "", "")
        return d

    @property
    def multi(self) -> bool:
        return len(self.known) > 1

    def order(self, indices: Iterable[int]) -> list[int]:
        """Device indices in the machine's order, the CPU backend's first."""
        return sorted(set(indices), key=lambda i: (i != self.cpu, i < 0, i))


def multi_device(info: SessionInfo) -> bool:
    """Whether a session is shown by device: its machine lists more than one device."""
    return Devices(info).multi


# (nodes, cpu, splits) -> [op_devices, its groups, its masks (each made once asked for)]
_OP_DEVICES: dict[tuple[Any, ...], list[Any]] = {}


def _op_entry(c: Compute, cpu: int) -> list[Any]:
    node = np.asarray(c.op_node, dtype=np.int64)
    splits = c.place.split_keys() if c.place is not None else ()
    key = (node.tobytes(), cpu, splits)
    got = _OP_DEVICES.get(key)
    if got is not None:
        return got
    out = ops_placed(node, splits, cpu)
    out.setflags(write=False)
    if len(_OP_DEVICES) >= 256:
        _OP_DEVICES.clear()
    got = _OP_DEVICES[key] = [out, None, None]
    return got


def ops_placed(node: np.ndarray, splits: Sequence[tuple[int, int, int]], cpu: int) -> np.ndarray:
    """The device of each op of nodes ``node``: that of the split (device, first node, end node)
    holding it, ``cpu`` if none."""
    out = np.full(len(node), cpu, dtype=np.int64)
    for d, i_start, i_end in splits:
        out[(node >= i_start) & (node < i_end)] = d
    return out


def op_devices(c: Compute, cpu: int) -> np.ndarray:
    """The device of each of a compute's ops (the split holding its node; ``cpu`` if none), an
    array not to be written to: every generation step repeats its graph's nodes and splits, and
    gets the array made for the first."""
    return _op_entry(c, cpu)[0]  # type: ignore[no-any-return]


def op_groups(c: Compute, cpu: int) -> tuple[list[int], list[int], Any, Any]:
    """The devices of a compute's ops (sorted), how many ops each, and the ops in device order
    with where each device's begin (for ``np.add.reduceat``), made once per graph and splits."""
    return _groups(_op_entry(c, cpu))


def op_placing(c: Compute, cpu: int) -> list[Any]:
    """Where a compute's ops ran, as cached: one object per graph and splits (while cached),
    for ``placing_devices`` and ``placing_groups``."""
    return _op_entry(c, cpu)


def placing_devices(got: list[Any]) -> np.ndarray:
    """``op_devices`` of the computes of an ``op_placing``."""
    return got[0]  # type: ignore[no-any-return]


def placing_groups(got: list[Any]) -> tuple[list[int], list[int], Any, Any]:
    """``op_groups`` of the computes of an ``op_placing``."""
    return _groups(got)


def _groups(got: list[Any]) -> tuple[list[int], list[int], Any, Any]:
    if got[1] is None:
        uniq, inv = np.unique(got[0], return_inverse=True)
        order = np.argsort(inv, kind="stable")
        counts = np.bincount(inv, minlength=len(uniq))
        got[1] = (uniq.tolist(), counts.tolist(), order, np.cumsum(counts) - counts)
    return got[1]  # type: ignore[no-any-return]


def op_masks(c: Compute, cpu: int) -> dict[int, np.ndarray]:
    """Per device with ops in a compute, which ops (read-only masks, made once per graph and
    splits, as ``op_devices``)."""
    got = _op_entry(c, cpu)
    if got[2] is None:
        masks = {d: got[0] == d for d in op_groups(c, cpu)[0]}
        for m in masks.values():
            m.setflags(write=False)
        got[2] = masks
    return got[2]  # type: ignore[no-any-return]


def layer_devices(c: Compute, cpu: int) -> np.ndarray:
    """The device of each of a compute's layer spans (``cpu`` for the CPU backend's)."""
    if c.layer_device is None:
        return np.full(len(c.layers), cpu, dtype=np.int64)
    return np.where(c.layer_device < 0, cpu, c.layer_device)


def compute_devices(c: Compute, cpu: int) -> list[int]:
    """The devices a compute ran on, in the order of its splits (then those only its layers name)."""
    splits = [s.device for s in c.place.splits] if c.place is not None else []
    return devices_in_order(splits, layer_devices(c, cpu).tolist(), cpu)


def devices_in_order(split_devices: list[int], layer_devs: list[int], cpu: int) -> list[int]:
    """``compute_devices`` of a compute whose splits ran on ``split_devices`` and whose layer
    spans on ``layer_devs``."""
    return list(dict.fromkeys(split_devices + layer_devs)) or [cpu]


# --- intervals -------------------------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals."""
    if type(intervals) is list and len(intervals) <= 1:  # (most lists of a step)
        return [iv for iv in intervals if iv[1] > iv[0]]
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def measure(u: Sequence[Interval]) -> int:
    """The length of merged intervals."""
    if len(u) == 1:  # (the common case: one stretch)
        return u[0][1] - u[0][0]
    return sum(b - a for a, b in u)


def overlap(u: Sequence[Interval], v: Sequence[Interval]) -> int:
    """The length of the intersection of two merged interval lists."""
    nu, nv = len(u), len(v)
    if not nu or not nv:
        return 0
    i = j = total = 0
    ua, ub = u[0]
    va, vb = v[0]
    while True:  # (one pair in hand at a time: this runs for every device of every step)
        a = ua if ua > va else va
        b = ub if ub < vb else vb
        if b > a:
            total += b - a
        if ub < vb:
            i += 1
            if i == nu:
                return total
            ua, ub = u[i]
        else:
            j += 1
            if j == nv:
                return total
            va, vb = v[j]


def clip(u: Sequence[Interval], lo: int, hi: int) -> list[Interval]:
    """Merged intervals (``union``'s) cut to ``[lo, hi]``."""
    if not u:
        return []
    if u[0][0] >= lo and u[-1][1] <= hi and u[0][1] > lo and u[-1][0] < hi:
        return list(u)  # (all inside: the window holds what its step waited for)
    return [(max(a, lo), min(b, hi)) for a, b in u if min(b, hi) > max(a, lo)]


def bandwidth(nbytes: float, ns: float) -> float | None:
    """Bytes per second, or None without a time."""
    return nbytes * 1e9 / ns if ns > 0 else None


# --- per step --------------------------------------------------------------------------------


@dataclass
class DeviceStep:
    """One device's part of one step (see the module doc)."""

    device: int
    timed: bool = False
    compute_ns: int = 0
    op_ns: int = 0
    n_ops: int = 0
    layer_ns: int = 0
    layers: set[int] = field(default_factory=set)
    outstanding_ns: int = 0
    idle_ns: int = 0
    gap_ns: int = 0
    wait_ns: int = 0
    copy_in_bytes: int = 0
    copy_out_bytes: int = 0
    copy_ns: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    data_bytes: int = 0
    net_ns: int = 0
    n_cmds: int = 0
    share: float = 0.0
    rpc: bool = False

    @property
    def transfer_bytes(self) -> int:
        if self.rpc:
            return self.sent_bytes + self.recv_bytes
        return self.copy_in_bytes + self.copy_out_bytes

    @property
    def transfer_ns(self) -> int:
        return self.net_ns if self.rpc else self.copy_ns


@dataclass
class StepTime:
    """A step's time by device, and its window split into compute, transfers and the host."""

    step: int
    kind: str
    n_tokens: int
    start: int
    token_ns: int  # the window: from the step's start to the last thing it waited for
    compute_ns: int = 0
    transfer_ns: int = 0
    host_ns: int = 0
    devices: dict[int, DeviceStep] = field(default_factory=dict)


_ROW_END = itemgetter(TransferRow._fields.index("end"))  # a transfers row's end


def step_window(step: Pass) -> Interval:
    """From the step's start to the last of its end, its computes' ends and its transfers'
    (from their rows as read: ``Transfers.bulk_rows``, no tuple made per row)."""
    end = step.end
    for c in step.computes:
        end = max(end, c.start + c.dur)
    for t in step.transfers:
        raw, t0 = t.bulk_rows()
        if raw:
            end = max(end, t0 + max(map(_ROW_END, raw)))
    return step.start, end


def _add_compute(c: Compute, devs: Devices, get: Any, work: dict[int, list[Interval]]) -> None:
    """A compute's ops, layers, copies and own-timed work, per device."""
    cpu = devs.cpu
    p = c.place
    n = len(c.op_node)
    if n and (p is None or not p.splits):  # every op the CPU backend's
        ds = get(cpu)
        ds.n_ops += n
        ds.op_ns += int(np.asarray(c.op_dur, dtype=np.int64).sum())
    elif n:  # (per device in one reduceat: the groups are the graph's, made once)
        uniq, counts, order, starts = op_groups(c, cpu)
        sums = np.add.reduceat(np.asarray(c.op_dur, dtype=np.int64)[order], starts).tolist()
        for d, k, x in zip(uniq, counts, sums, strict=True):
            ds = get(d)
            ds.n_ops += k
            ds.op_ns += x
    for lay, d in zip(c.layers, layer_devices(c, cpu).tolist(), strict=True):
        ds = get(d)
        ds.layer_ns += lay.dur
        ds.layers.add(lay.layer)
    if p is None:
        return
    for cp in p.copies:
        ds = get(cp.dst)
        ds.copy_in_bytes += cp.bytes
        ds.copy_ns += cp.dur
        ds = get(cp.src)
        ds.copy_out_bytes += cp.bytes
        ds.copy_ns += cp.dur
    for b in p.busy:
        work.setdefault(b.device, []).append((b.start, b.start + b.dur))
    for r in p.remote:
        work.setdefault(r.device, []).append((r.start, r.end))
    for s in p.splits:
        if s.device == cpu:  # the CPU backend computes its split before it returns
            work.setdefault(cpu, []).append((s.launch, s.end))


def _outstanding(c: Compute) -> dict[int, tuple[list[Interval], list[int]]]:
    """Per device: from each split's launch to when the device was done with it, and how long
    after the launch it started (the splits it timed itself)."""
    p = c.place
    out: dict[int, tuple[list[Interval], list[int]]] = {}
    if p is None:
        return out
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    for b in p.busy:
        if b.split >= 0:
            firsts[b.split] = min(firsts.get(b.split, b.start), b.start)
            lasts[b.split] = max(lasts.get(b.split, 0), b.start + b.dur)
    for r in p.remote:
        if r.split >= 0:
            firsts[r.split] = min(firsts.get(r.split, r.start), r.start)
            lasts[r.split] = max(lasts.get(r.split, 0), r.end)
    for k, s in enumerate(p.splits):
        spans, gaps = out.setdefault(s.device, ([], []))
        spans.append((s.launch, max(s.end, lasts.get(k, s.end))))
        if k in firsts:
            gaps.append(max(0, firsts[k] - s.launch))
    return out


def _transfer_rows(rows: Iterable[TransferRow], get: Any) -> dict[int, list[Interval]]:
    """Commands per device: bytes and counts, and their intervals on the connection."""
    net: dict[int, list[Interval]] = {}
    last: DeviceStep | None = None
    for r in rows:
        ds = last if last is not None and last.device == r.device else get(r.device)
        last = ds
        ds.rpc = True
        ds.n_cmds += 1
        ds.sent_bytes += r.sent
        ds.recv_bytes += r.recv
        ds.data_bytes += r.bytes
        net.setdefault(r.device, []).append((r.start, r.end))
    return net


def step_time(step: Step, devs: Devices) -> StepTime:
    """A step's figures per device (see the module doc; ``step_times`` makes them for every
    step of a session at once, in columns: the tables' way)."""
    lo, hi = step_window(step)
    st = StepTime(step.index, step.kind, step.n_tokens, lo, hi - lo)
    cpu = devs.cpu

    def get(d: int) -> DeviceStep:
        ds = st.devices.get(d)
        if ds is None:
            ds = st.devices[d] = DeviceStep(d, rpc=devs[d].is_rpc)
        return ds

    work: dict[int, list[Interval]] = {}
    pending: dict[int, list[Interval]] = {}
    copies: list[Interval] = []
    for c in step.computes:
        _add_compute(c, devs, get, work)
        for d, (spans, gaps) in _outstanding(c).items():
            pending.setdefault(d, []).extend(spans)
            get(d).gap_ns += sum(gaps)
        if c.place is not None:
            copies += [(cp.start, cp.start + cp.dur) for cp in c.place.copies]
    net = _transfer_rows((r for t in step.transfers for r in t.rows), get)
    busy = {d: clip(union(iv), lo, hi) for d, iv in work.items()}
    cpu_busy = busy.get(cpu, [])
    for d, ds in st.devices.items():
        own = busy.get(d, [])
        ds.timed = d in busy
        ds.compute_ns = measure(own)
        ds.share = ds.compute_ns / st.token_ns if st.token_ns > 0 else 0.0
        link = union(net.get(d, []))
        ds.net_ns = measure(link) - overlap(link, own)
        if d == cpu:
            continue
        out = clip(union(pending.get(d, [])), lo, hi)
        ds.outstanding_ns = measure(out)
        if ds.timed:
            ds.idle_ns = ds.outstanding_ns - overlap(out, own)
        waiting = union(out + link)
        ds.wait_ns = measure(waiting) - overlap(waiting, cpu_busy)
    every = union(iv for u in busy.values() for iv in u)
    moving = clip(union([iv for u in net.values() for iv in u] + copies), lo, hi)
    st.compute_ns = measure(every)
    st.transfer_ns = measure(moving) - overlap(moving, every)
    st.host_ns = st.token_ns - st.compute_ns - st.transfer_ns
    return st


def load_time(blocks: Iterable[Transfers], devs: Devices, phase: str = "load") -> StepTime:
    """The commands of the ``transfers`` records of ``phase`` (outside any step), per device, over
    the span from the first command's issue to the last one's end."""
    rows = [r for t in blocks if t.phase == phase for r in t.rows]
    lo = min((r.queue for r in rows), default=0)
    hi = max((r.end for r in rows), default=0)
    st = StepTime(-1, phase, 0, lo, hi - lo)

    def get(d: int) -> DeviceStep:
        ds = st.devices.get(d)
        if ds is None:
            ds = st.devices[d] = DeviceStep(d, rpc=True)
        return ds

    net = _transfer_rows(rows, get)
    for d, ds in st.devices.items():
        ds.net_ns = measure(union(net[d]))
    st.transfer_ns = measure(union(iv for u in net.values() for iv in u))
    st.host_ns = st.token_ns - st.transfer_ns
    return st


# --- what a trace shows of it ---------------------------------------------------------------


def transfer_args(r: TransferRow) -> dict[str, Any]:
    """What a transfer's slice says: bytes, and the rate achieved over its time on the link."""
    dur = r.end - r.start
    bw = bandwidth(r.sent + r.recv, dur)
    return {
        "tensor": r.tensor,
        "bytes": r.bytes,
        "sent": r.sent,
        "recv": r.recv,
        "queued_ns": r.start - r.queue,
        "mb_per_s": round(bw / 1e6, 3) if bw is not None else 0.0,
    }


# --- what dominates --------------------------------------------------------------------------


def bottleneck(rows: Sequence[dict[str, Any]], parts: dict[str, Any], what: str) -> list[str]:
    """A line or two on what dominates ``what`` (e.g. "a decode token"): ``rows`` the devices'
    figures (``name``, ``compute_ns``, ``layer_ns``, ``n_layers``, ``timed``), ``parts`` the window's
    (``token_ns``, ``transfer_ns``, ``host_ns``, ``transfer_kind``: network or copies), all totals
    over the same steps."""
    token = parts.get("token_ns") or 0
    if token <= 0:
        return []
    cands = [(r["compute_ns"] / token, f"{r['name']} computes") for r in rows if r.get("timed")]
    cands.append((parts["transfer_ns"] / token, parts["transfer_kind"]))
    cands.append((parts["host_ns"] / token, "host (no device computing, nothing moving)"))
    share, who = max(cands, key=lambda x: x[0])
    lines = [f"{who}: {share * 100:.0f} % of {what}"]
    blind = [r["name"] for r in rows if not r.get("timed") and r.get("transfer_bytes")]
    if blind:  # (a stock RPC server: its compute hides in the round trips)
        lines.append(
            f"{', '.join(blind)} timed nothing of their own (stock servers?): their compute is "
            f"counted as {parts['transfer_kind']}"
        )
    timed = [r for r in rows if r.get("timed") and r.get("n_layers") and r.get("layer_ns")]
    if len(timed) >= 2:
        per = sorted(timed, key=lambda r: r["layer_ns"] / r["n_layers"])
        fast, slow = per[0], per[-1]
        ratio = (slow["layer_ns"] / slow["n_layers"]) / (fast["layer_ns"] / fast["n_layers"])
        if ratio >= 1.2:
            if slow["n_layers"] == fast["n_layers"]:
                lines.append(
                    f"{slow['name']} computes {ratio:.1f}x longer than {fast['name']} for the "
                    f"same number of layers ({slow['n_layers']})"
                )
            else:
                lines.append(
                    f"{slow['name']} takes {ratio:.1f}x longer per layer than {fast['name']} "
                    f"({slow['n_layers']} and {fast['n_layers']} layers)"
                )
    return lines
