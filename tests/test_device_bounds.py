"""A device's part of a compute spans its ops' first start to last end (``devices.op_bounds``):
one ``reduceat`` per column over the plan's runs, taken as they are when the runs are the
devices in order (``Plan.in_order``), else put in the devices' order. Both ways must give what
counting op by op gives, on the device fixtures' computes and on made-up splits whose devices
come out of order."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import FIXTURES

from llamacpp_instr.converters.reading.decode.computes import Compute
from llamacpp_instr.converters.reading.decode.sessions import StepDone
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.device_plan import Plan
from llamacpp_instr.converters.traces.device_tracks import op_bounds

pytestmark = pytest.mark.fast

LOGS = [
    FIXTURES / "tiny-llama-vulkan-partial-detailed.log.gz",
    FIXTURES / "tiny-llama-rpc2-detailed.log.gz",
]


def _by_hand(c: Compute, keys: tuple[tuple[int, int, int], ...], cpu: int) -> Any:
    """Each device's (sorted) first start and last end, op by op (a node no split holds runs
    on ``cpu``, as ``device_time.ops_placed`` places it)."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for i, s, u in zip(c.op_node.tolist(), c.op_start.tolist(), c.op_dur.tolist(), strict=True):
        d = next((d for d, a, b in keys if a <= i < b), cpu)
        lo[d] = min(lo.get(d, s), s)
        hi[d] = max(hi.get(d, s + u), s + u)
    return [lo[d] for d in sorted(lo)], [hi[d] for d in sorted(hi)]


def test_op_bounds_in_order_or_not() -> None:
    """The fixtures' computes with their own splits (RPC: devices in order; Vulkan: the GPU's
    split first, device 1 before device 0), and each RPC compute with its splits' devices
    reversed: the bounds op by op, and both paths taken."""
    in_order = permuted = 0
    for log in LOGS:
        for ev in iter_events_packed(log):
            if not isinstance(ev, StepDone):
                continue
            for c in ev.step.computes:
                if c.place is None or not c.place.splits or not len(c.op_node):
                    continue
                keys = c.place.split_keys()
                variants = [keys, tuple((2 - d, a, b) for d, a, b in keys)]
                for ks in variants if "rpc" in log.name else variants[:1]:
                    plan = Plan(c, ks, 0)
                    if len(plan.run_group) != len(plan.counts):
                        continue  # (a device in several runs: test_device_rows has those)
                    if plan.in_order is not None:
                        in_order += 1
                    else:
                        permuted += 1
                    assert op_bounds(c, plan) == _by_hand(c, ks, 0), (log.name, ks)
    assert in_order and permuted


def test_mb_per_s_rounder_is_rounding_rounder() -> None:
    """``op_args.mb_per_s`` spells ``rounding.ROUNDER`` as a literal (a constant, not a name
    looked up per row): the two must be one number, 1.5 * 2**52, whose sum with any ``0 <= p <
    2**51`` is an integer-spaced double."""
    import inspect

    from llamacpp_instr.converters.traces import op_args, rounding

    assert rounding.ROUNDER == 6755399441055744.0 == 1.5 * 2**52
    assert "6755399441055744.0" in inspect.getsource(op_args.mb_per_s)
    for p in (0.5, 1.5, 2.5, 1e12 + 0.5, 12345.4999):
        assert p + rounding.ROUNDER - rounding.ROUNDER == round(p)
