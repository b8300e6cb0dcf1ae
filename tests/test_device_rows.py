"""The device layout reads a placement's and a transfers record's rows as read (``Placement.bulk``,
``Transfers.bulk_rows``: times relative to the record's start) when they were kept, and their
tuples (times absolute) when the record was read row by row: both must lay out the same items.
Here every record of the device fixtures is laid out both ways and the items compared."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES

from llamacpp_instr.converters.reading.decode.placement import Placement
from llamacpp_instr.converters.reading.decode.sessions import SessionStarted, StepDone
from llamacpp_instr.converters.reading.decode.transfers import Transfers
from llamacpp_instr.converters.session import device_time as dt
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.device_lanes import DeviceLanes
from llamacpp_instr.converters.traces.device_own import OwnTiming
from llamacpp_instr.converters.traces.device_plan import Plan, Plans
from llamacpp_instr.converters.traces.device_tracks import copy_rows, op_bounds
from llamacpp_instr.converters.traces.items import (
    ComputeBatch,
    LayoutStats,
    Selection,
    SliceRows,
    Track,
)
from llamacpp_instr.converters.traces.layout import layout_bulk
from llamacpp_instr.converters.traces.network import NetworkTracks
from llamacpp_instr.converters.traces.op_args import mb_per_s

pytestmark = pytest.mark.fast

LOGS = [
    FIXTURES / "tiny-llama-vulkan-full-detailed.log.gz",
    FIXTURES / "tiny-llama-vulkan-partial-detailed.log.gz",
    FIXTURES / "tiny-llama-rpc2-detailed.log.gz",
]


def _as_tuples(events: list[Any]) -> int:
    """Each placement and transfers record of ``events`` as if read row by row (its tuples, no
    rows kept); how many records had their rows kept."""
    kept = 0
    for ev in events:
        if not isinstance(ev, StepDone):
            continue
        step = ev.step
        for c in step.computes:
            p = c.place
            if p is not None and p.raw is not None:
                kept += 1
                c.place = Placement(p.splits, p.copies, p.busy, p.remote, p.clocks, p.wait)
        for k, t in enumerate(step.transfers):
            if t.raw is not None:
                kept += 1
                step.transfers[k] = Transfers(t.phase, t.ctx, t.step, t.dropped, list(t.rows))
    return kept


def _plain(items: Any) -> list[Any]:
    """The items, comparable: a batch's ops as their track and kept positions."""
    out: list[Any] = []
    for it in items:
        if isinstance(it, ComputeBatch):
            ops = it.ops
            keep = None
            if ops is not None:
                k = ops.keep
                if isinstance(k, slice):  # (a device's contiguous ops)
                    keep = list(range(len(ops.compute.op_node)))[k]
                else:
                    keep = None if k is None else k.nonzero()[0].tolist()
            out.append((it.slice, list(it.layers), ops and (ops.track, id(ops.compute), keep)))
        elif isinstance(it, SliceRows):
            out.append((it.category, it.track, it.name, it.ts, it.dur, it.args, it.flows_in))
        else:
            out.append(it)
    return out


@pytest.mark.parametrize("log", LOGS, ids=[p.name.split("-detailed")[0] for p in LOGS])
def test_rows_as_read_or_as_tuples(log: Path) -> None:
    events = list(iter_events_packed(log))
    kept = _plain(layout_bulk(iter(events), Selection(), LayoutStats()))
    assert _as_tuples(events) > 0  # (the fixtures' rows are all well-formed: kept)
    again = _plain(layout_bulk(iter(events), Selection(), LayoutStats()))
    assert any(isinstance(x, tuple) and x[0] == "copy" for x in kept)
    assert kept == again


def test_op_bounds_of_devices_in_several_runs() -> None:
    """A device whose ops are not one run (its splits between another's): its ops' count, first
    start and last end all the same, as counted here op by op."""
    events = list(iter_events_packed(LOGS[2]))
    c = next(c for ev in events if isinstance(ev, StepDone) for c in ev.step.computes)
    nodes = c.op_node.tolist()
    assert len(set(nodes)) > 6
    cut = sorted(set(nodes))
    # devices 0, 1, 0, 2, 1 over five ranges of the compute's nodes
    edges = [cut[len(cut) * k // 5] for k in range(5)] + [cut[-1] + 1]
    keys = tuple((d, edges[k], edges[k + 1]) for k, d in enumerate([0, 1, 0, 2, 1]))
    plan = Plan(c, keys, 0)
    assert len(plan.run_group) > len(plan.counts)  # (some device in several runs)
    want: dict[int, tuple[int, int, int]] = {}
    for i, s, u in zip(nodes, c.op_start.tolist(), c.op_dur.tolist(), strict=True):
        d = next(d for d, a, b in keys if a <= i < b)
        k, lo, hi = want.get(d, (0, s, s + u))
        want[d] = (k + 1, min(lo, s), max(hi, s + u))
    lo, hi = op_bounds(c, plan)
    assert list(zip(plan.counts, lo, hi, strict=True)) == [want[d] for d in sorted(want)]


def test_plans_by_splits_and_layer_devices() -> None:
    """A compute's plan is made once per its ops' nodes, splits and layer devices: the same
    compute with its splits on other devices, or its layers on another, gets another plan,
    whose parts say so."""
    events = list(iter_events_packed(LOGS[2]))
    c = next(c for ev in events if isinstance(ev, StepDone) for c in ev.step.computes)
    assert c.place is not None and c.layer_device is not None
    rows = c.place.bulk()[0][0]
    plans = Plans(0)
    plan = plans.get(c, rows)
    assert plans.get(c, [list(r) for r in rows]) is plan  # (the same structure: kept)
    devices = [p.device for p in plan.parts]
    swapped = [[{1: 2, 2: 1}.get(r[0], r[0]), *r[1:]] for r in rows]
    other = plans.get(c, swapped)
    assert other is not plan
    assert [p.device for p in other.parts][: len(rows)] == [r[0] for r in swapped]
    for p in other.parts:  # each device's ops: those of its split's nodes, as placed here
        want = [
            next((r[0] for r in swapped if r[1] <= i < r[2]), 0) == p.device
            for i in c.op_node.tolist()
        ]
        assert p.mask.tolist() == want
    layer_device = c.layer_device
    try:
        c.layer_device = np.full(len(c.layers), 2, dtype=np.int64)
        moved = plans.get(c, rows)
        assert moved is not plan
        by_device = {p.device: p for p in moved.parts}
        assert by_device[2].spans == slice(0, len(c.layers))
        assert all(not p.spans for d, p in by_device.items() if d != 2)
    finally:
        c.layer_device = layer_device
    assert plans.get(c, rows) is plan and devices == [p.device for p in plan.parts]


def test_last_plan_is_not_kept_for_other_nodes() -> None:
    """The plan got last is returned again only for the same structure: the same compute with
    one op's node moved to another split gets a plan that places that op on the other device,
    and the compute as it was gets its own plan back."""
    events = list(iter_events_packed(LOGS[2]))
    c = next(c for ev in events if isinstance(ev, StepDone) for c in ev.step.computes)
    assert c.place is not None
    rows = c.place.bulk()[0][0]
    assert len({r[0] for r in rows}) > 1
    plans = Plans(0)
    plan = plans.get(c, rows)
    node = c.op_node
    first, last = rows[0], rows[-1]
    k = int(np.flatnonzero((node >= first[1]) & (node < first[2]))[0])
    try:
        c.op_node = node.copy()
        c.op_node[k] = last[1]  # (a node of the last split)
        moved = plans.get(c, rows)
        assert moved is not plan
        assert moved.devices[k] == last[0] != plan.devices[k]
    finally:
        c.op_node = node
    assert plans.get(c, rows) is plan


@pytest.mark.parametrize("log", LOGS, ids=[p.name.split("-detailed")[0] for p in LOGS])
def test_plans_place_as_device_time(log: Path) -> None:
    """The plan's devices are ``device_time``'s: each op's (``op_devices``), the compute's in
    order (``compute_devices``), each device's ops (``op_masks``) and layer spans
    (``layer_devices``), for every compute of the fixtures."""
    events = list(iter_events_packed(log))
    info = next(ev.session for ev in events if isinstance(ev, SessionStarted))
    cpu = dt.Devices(info).cpu
    plans = Plans(cpu)
    computes = [c for ev in events if isinstance(ev, StepDone) for c in ev.step.computes]
    assert computes
    runs = 0
    for c in computes:
        plan = plans.get(c, c.place.bulk()[0][0] if c.place is not None else [])
        assert plan.devices.tolist() == dt.op_devices(c, cpu).tolist()
        assert [p.device for p in plan.parts] == dt.compute_devices(c, cpu)
        masks = dt.op_masks(c, cpu)
        lds = dt.layer_devices(c, cpu).tolist()
        for p in plan.parts:
            if not len(c.op_node):  # (no ops: no mask)
                assert p.mask is None
            else:
                want = masks.get(p.device)
                no_op = [False] * len(c.op_node)
                assert p.mask.tolist() == (want.tolist() if want is not None else no_op)
                # the run, where set, selects the same ops; set exactly when they are contiguous
                at = [i for i, x in enumerate(p.mask.tolist()) if x]
                contiguous = bool(at) and at[-1] - at[0] == len(at) - 1
                assert (p.run is not None) == contiguous
                if p.run is not None:
                    runs += 1
                    assert list(range(len(c.op_node))[p.run]) == at
            idx = range(len(lds))[p.spans] if isinstance(p.spans, slice) else p.spans
            assert list(idx) == [i for i, d in enumerate(lds) if d == p.device]
    assert runs  # (the fixtures' devices hold contiguous ops)


def _rate_cases() -> list[tuple[int, int]]:
    """Sizes and times: random, those whose thousandths end in an exact half (0.0625 MB/s) and
    those that end in a decimal half (Python rounds all of those itself)."""
    rng = random.Random(38)
    cases = [(rng.randrange(1 << rng.randrange(1, 40)), rng.randrange(-3, 1 << rng.randrange(1, 34)))
             for _ in range(50_000)]  # fmt: skip
    cases += [(nb, 16_000 * nb) for nb in range(1, 200)]  # (x * 1000 == 62.5)
    cases += [(nb, ns) for nb in range(0, 500) for ns in (1, 3, 7, 1000, 1024, 10**6, 10**9)]
    # thousandths that are a half in decimal, not in binary (0.0015 MB/s: ``x * 1000`` may
    # round to 1.5 exactly, which a tie to even would take to 2)
    cases += [(2 * j + 1, 2_000_000) for j in range(500)]
    return cases


def _want_rate(nb: int, ns: int) -> bytes:
    return struct.pack("<d", round(nb * 1e9 / ns / 1e6, 3) if ns > 0 else 0.0)


def test_mb_per_s_is_pythons_round() -> None:
    """A copy's or a command's rate is ``round(nbytes * 1e9 / ns / 1e6, 3)`` to the bit, on
    random sizes and times and on those whose thousandths end in an exact half, 0.0 without a
    time."""
    halves = 0
    for nb, ns in _rate_cases():
        assert struct.pack("<d", mb_per_s(nb, ns)) == _want_rate(nb, ns), (nb, ns)
        halves += ns > 0 and (nb * 1e12 / ns / 1e6) % 1 == 0.5
    assert halves >= 199


def test_copy_and_command_rates_are_pythons_round() -> None:
    """``copy_rows`` and ``NetworkTracks._commands`` spell ``mb_per_s``'s usual path out: each
    row's rate is still Python's ``round``, to the bit (the cases of ``mb_per_s``'s test, a
    copy's bytes and a command's sent plus received bytes over its duration)."""
    info = next(ev.session for ev in iter_events_packed(LOGS[2]) if isinstance(ev, SessionStarted))
    devs = dt.Devices(info)
    process = Track(1, "p", None, "process", 0, 1000)
    cases = [(nb, ns) for nb, ns in _rate_cases() if ns >= 0]  # (a row's duration is not < 0)
    assert len(cases) > 50_000
    lanes = DeviceLanes(info.sid, process, devs, True)
    # copies: one after the other, each of its own size and duration
    cps, t = [], 0
    for nb, ns in cases:
        cps.append([0, -1, "t", nb, 0, 1, t, ns])
        t += ns + 1
    copied = [0, 0]
    rows = copy_rows(cps, 0, lanes, lanes.get(("copies",), "copies", 70), {}, devs, copied)
    assert copied == [len(cases), sum(nb for nb, _ in cases)]
    got = [struct.pack("<d", a["mb_per_s"]) for a in rows.args]
    assert got == [_want_rate(nb, ns) for nb, ns in cases]
    # commands: sent + received bytes over the duration (from start to end)
    net = NetworkTracks(info, lanes)
    net.network = Track(2, "network", 1, "slices", 71, 1000)
    raw, t = [], 0
    for nb, ns in cases:
        raw.append([0, "set_tensor", "t", nb, nb - nb // 3, nb // 3, t, t, t, t + ns])
        t += ns + 1
    rows = net._commands([("step", 0, raw)])
    got = [struct.pack("<d", a["mb_per_s"]) for a in rows.args]
    assert got == [_want_rate(nb, ns) for nb, ns in cases]


def test_busy_rows_of_devices_in_turn() -> None:
    """Command buffers of two devices in turn: each row's idle time is from its own device's
    last end (not the other's), the first of each device has none, and a split out of range
    has no launch gap; the args' names come in one order."""
    info = next(ev.session for ev in iter_events_packed(LOGS[2]) if isinstance(ev, SessionStarted))
    devs = dt.Devices(info)
    own = OwnTiming(devs, DeviceLanes(info.sid, Track(1, "p", None, "process", 0, 1000), devs))
    sp = [[0, 0, 10, 0, 5, 50], [1, 10, 20, 60, 65, 90]]  # (device, i0, i1, start, launch, end)
    # (device, start, dur, split, n_ops), times relative to t0
    bs = [
        [0, 10, 20, 0, 3],
        [1, 15, 10, 1, 4],
        [0, 40, 5, 0, 2],
        [1, 20, 30, 7, 1],
        [0, 45, 1, -1, 0],
    ]
    rows = own.busy(bs, sp, 1000, {1: 99})
    assert rows.ts == [1010, 1015, 1020, 1040, 1045] and rows.dur == [20, 10, 30, 5, 1]
    assert rows.name == ["command buffer"] * 5
    want = [
        {"split": 0, "n_ops": 3, "device": devs[0].name, "since_launch_ns": 5},
        {"split": 1, "n_ops": 4, "device": devs[1].name, "since_launch_ns": -50},
        {"split": 7, "n_ops": 1, "device": devs[1].name, "idle_before_ns": 0},
        {
            "split": 0,
            "n_ops": 2,
            "device": devs[0].name,
            "idle_before_ns": 10,
            "since_launch_ns": 35,
        },
        {"split": -1, "n_ops": 0, "device": devs[0].name, "idle_before_ns": 0},
    ]
    assert [list(a.items()) for a in rows.args] == [list(a.items()) for a in want]
    assert rows.flows_in == {1: (99,)}


def test_copies_of_splits_and_pairs_in_turn() -> None:
    """Copies whose splits and device pairs change from row to row (and come back): each
    split's count and bytes, and each row's names, as counted here row by row."""
    info = next(ev.session for ev in iter_events_packed(LOGS[2]) if isinstance(ev, SessionStarted))
    devs = dt.Devices(info)
    lanes = DeviceLanes(info.sid, Track(1, "p", None, "process", 0, 1000), devs)
    # (split, node, tensor, bytes, src, dst, start, dur), given out of time order
    cps = [
        [2, 5, "c", 300, 1, 2, 30, 5],
        [0, -1, "a", 100, 0, 1, 10, 5],
        [0, 3, "b", 200, 0, 1, 20, 5],
        [1, -1, "d", 400, 0, 2, 40, 5],
        [0, -1, "e", 500, 0, 1, 50, 5],
        [2, -1, "f", 600, 1, 2, 60, 5],
        [2, -1, "g", 700, 1, 2, 70, 5],
    ]
    copied = [0] * 6
    track = lanes.get(("copies",), "copies", 70)
    rows = copy_rows(cps, 0, lanes, track, {}, devs, copied)
    # (one after the other: all on the copies' first lane, made at the first row)
    assert len(track.uuids) == 1 and rows.track == track.uuids * 7
    assert [(r, t.uuid) for r, t in rows.tracks] == [(0, track.uuids[0])]
    want = [0] * 6
    for r in cps:
        want[2 * r[0]] += 1
        want[2 * r[0] + 1] += r[3]
    assert copied == want == [3, 800, 1, 400, 3, 1600]
    order = sorted(cps, key=lambda r: r[6])
    assert [a["tensor"] for a in rows.args] == list("abcdefg")
    assert rows.name == [f"{devs[r[4]].name} → {devs[r[5]].name}" for r in order]
    assert [(a["from"], a["to"], a["split"]) for a in rows.args] == [
        (devs[r[4]].name, devs[r[5]].name, r[0]) for r in order
    ]


def test_commands_of_servers_in_turn() -> None:
    """Commands of two servers in turn, in several parts (offsets), one overlapping its
    server's last: each on its server's lane (the overlapping one on a second lane, the next
    back on the first), named and timed as its row says."""
    info = next(ev.session for ev in iter_events_packed(LOGS[2]) if isinstance(ev, SessionStarted))
    devs = dt.Devices(info)
    net = NetworkTracks(info, DeviceLanes(info.sid, Track(1, "p", None, "process", 0, 1000), devs))
    net.network = Track(2, "network", 1, "slices", 71, 1000)

    def row(d: int, cmd: str, s: int, e: int) -> list[Any]:
        return [d, cmd, "t", 8, 10, 2, s, s, s, e]

    parts = [
        ("load", 0, [row(1, "a", 0, 4), row(1, "g", 4, 10), row(2, "b", 5, 20)]),
        ("load", 100, [row(1, "c", -88, -85), row(1, "d", -87, -80)]),  # (d overlaps c)
        ("step", 50, [row(2, "e", -20, -10), row(1, "f", -35, -30)]),
    ]
    rows = net._commands(parts)
    assert rows.name == list("agbcdef")
    assert rows.ts == [0, 4, 5, 12, 13, 30, 15] and rows.dur == [4, 6, 15, 3, 7, 10, 5]
    one, two = net.labels[1][1].uuids, net.labels[2][1].uuids
    assert len(one) == 2 and len(two) == 1
    assert rows.track == [one[0], one[0], two[0], one[0], one[1], two[0], one[0]]
    assert [r for r, _ in rows.tracks] == [0, 2, 4]  # (each lane made at its first row)
    assert [a["phase"] for a in rows.args] == ["load"] * 5 + ["step"] * 2
