"""What every generation step of a device log repeats, made once for ``devices.DeviceTracks``:
per graph (its ops' nodes), splits and layer devices, the devices a compute ran on in their order,
each one's layer spans, ops (a read-only mask and its count) and the grouping that gives its ops'
first start and last end. A step then only reads its times.

The devices are ``device_time``'s (``ops_placed``, ``layer_devices``, ``devices_in_order``), from
a ``Placement``'s rows as read (``Placement.bulk``): no ``Split`` tuple per row."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ..reading.decode.computes import Compute
from ..session import device_time as dt

_SPLIT_KEY = itemgetter(0, 1, 2)  # a splits row's device and node range


class DevicePart(NamedTuple):
    """A device's part of a compute: its device, its layer spans (``spans``: a slice of the
    compute's when they are contiguous, else their positions), its ops (``mask``, read-only; None
    when the compute has none; ``run``: the same as a slice when they are contiguous, which
    selects them without a copy), their group in the plan's ``order`` (-1: none) and their count
    (``n_ops``: the mask's, counted once)."""

    device: int
    spans: slice | list[int]
    mask: Any
    group: int
    run: slice | None
    n_ops: int


class Plan:
    """One structure's plan (see the module doc): ``parts`` in ``compute_devices``' order; each
    op's device (``devices``); the devices with ops, sorted, and how many each (``counts``); where
    each run of ops of one device begins (``runs``) and its device's position in ``counts``
    (``run_group``): a device's ops are one run or a few, whatever the graph."""

    __slots__ = ("parts", "counts", "devices", "runs", "run_group", "in_order", "texts")

    def __init__(self, c: Compute, keys: tuple[tuple[int, int, int], ...], cpu: int) -> None:
        node = np.asarray(c.op_node, dtype=np.int64)
        od = dt.ops_placed(node, keys, cpu)
        self.devices = od  # (the per-op fallback of times past 2**62: ``devices.op_bounds``)
        uniq_a, counts_a = np.unique(od, return_counts=True)  # (as device_time.op_groups)
        self.counts = counts_a.tolist()
        group = {d: g for g, d in enumerate(uniq_a.tolist())}
        self.runs = np.flatnonzero(np.r_[True, od[1:] != od[:-1]]) if len(od) else od
        self.run_group = [group[d] for d in od[self.runs].tolist()]
        # ``run_group`` itself when it is 0, 1, 2...: a run per device, in their order (the
        # runs' bounds are then the devices', ``devices.op_bounds``)
        self.in_order = self.run_group if self.run_group == list(range(len(self.counts))) else None
        lds = dt.layer_devices(c, cpu).tolist()
        has_ops = len(node) > 0
        # each split's device label, slice name and node range (``DeviceTracks``, when first
        # drawn: the labels are the session's)
        self.texts: list[tuple[str, str, str]] | None = None
        self.parts: list[DevicePart] = []
        for d in dt.devices_in_order([k[0] for k in keys], lds, cpu):
            idx = [i for i, x in enumerate(lds) if x == d]
            spans: slice | list[int] = idx
            if idx and idx[-1] - idx[0] == len(idx) - 1:
                spans = slice(idx[0], idx[-1] + 1)
            mask = run = None
            if has_ops:
                mask = od == d
                mask.setflags(write=False)
                at = np.flatnonzero(mask)
                if len(at) and at[-1] - at[0] == len(at) - 1:
                    run = slice(int(at[0]), int(at[-1]) + 1)
            g = group.get(d, -1)
            self.parts.append(DevicePart(d, spans, mask, g, run, self.counts[g] if g >= 0 else 0))


class Plans:
    """The plans of a session, by structure (a few: every generation step repeats one)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.plans: dict[tuple[Any, ...], Plan] = {}
        # the last plan got and its key: a step's computes nearly always repeat the last one's
        # structure, which an equal key (byte compares) finds without hashing the op nodes
        self.last: tuple[tuple[Any, ...], Plan] | None = None

    def get(self, c: Compute, split_rows: list[Any]) -> Plan:
        """The plan of ``c``, whose splits rows (``Placement.bulk``) are ``split_rows``."""
        ld = c.layer_device
        keys = tuple(map(_SPLIT_KEY, split_rows))
        key = (
            np.asarray(c.op_node, dtype=np.int64).tobytes(),
            keys,
            len(c.layers),
            ld.tobytes() if ld is not None else None,
        )
        last = self.last
        if last is not None and last[0] == key:
            return last[1]
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= 256:
                self.plans.clear()
            plan = self.plans[key] = Plan(c, keys, self.cpu)
        self.last = (key, plan)
        return plan
