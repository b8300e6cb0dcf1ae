"""session.step_times (every step's device figures at once, in columns, for load_session's
device_steps and token_time tables) against device_time.step_time, step by step: random steps
with overlapping, out-of-window, empty and unmatched intervals on devices the machine lists or
not, through frames_devices.DeviceBuilder as load_session feeds it."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from llamacpp_instr.converters.analysis.frames_devices import DeviceBuilder
from llamacpp_instr.converters.reading.decode.columns import LayerSpan
from llamacpp_instr.converters.reading.decode.computes import Compute
from llamacpp_instr.converters.reading.decode.placement import Busy, Copy, Placement, Remote, Split
from llamacpp_instr.converters.reading.decode.sessions import SessionInfo
from llamacpp_instr.converters.reading.decode.steps import Step
from llamacpp_instr.converters.reading.decode.transfers import TransferRow, Transfers
from llamacpp_instr.converters.session import device_time as dt
from llamacpp_instr.converters.session.step_times import _distinct, _Lookup, union_measure

pytestmark = pytest.mark.fast

DEVICES = [
    {"index": 0, "name": "CPU", "backend": "CPU", "type": "cpu"},
    {"index": 1, "name": "Vulkan0", "backend": "Vulkan", "type": "gpu"},
    {"index": 2, "name": "RPC0", "backend": "RPC", "description": "h:1", "type": "gpu"},
]


def _info() -> SessionInfo:
    return SessionInfo(
        sid="s", start_ts=0, wall_time="", level="detailed", schema_version=1, producer={},
        metadata={}, model={}, context={}, weights=[], memory={}, machine={"devices": DEVICES},
    )  # fmt: skip


def _compute(rng: random.Random, t0: int, index: int) -> Compute:
    """A compute whose rows are each drawn at random: times around the step's window (some
    outside it), empty intervals, splits that none of the device's rows name."""
    t = lambda: t0 + rng.randrange(-50, 400)  # noqa: E731
    dev = lambda: rng.choice([0, 0, 1, 2, 3])  # noqa: E731 - 3: a device the machine lacks
    splits = []
    for _ in range(rng.randrange(0, 4)):
        s = t()
        la = s + rng.randrange(0, 40)
        splits.append(Split(dev(), rng.randrange(0, 20), rng.randrange(20, 40), s, la,
                            la + rng.choice([0, rng.randrange(0, 200)])))  # fmt: skip
    n = len(splits)
    ref = lambda: rng.randrange(-1, n) if n else -1  # noqa: E731
    place = Placement(
        splits=splits,
        copies=[Copy(rng.randrange(0, n), rng.randrange(-1, 9), "x", rng.randrange(0, 5000),
                     dev(), dev(), t(), rng.choice([0, rng.randrange(0, 90)]))
                for _ in range(rng.randrange(0, 5) if n else 0)],
        busy=[Busy(dev(), t(), rng.choice([0, rng.randrange(0, 150)]), ref(), rng.randrange(0, 9))
              for _ in range(rng.randrange(0, 5))],
        remote=[Remote(ref(), dev(), 0, 0, (s := t()), s + rng.choice([0, rng.randrange(0, 150)]),
                       0, 0, 0, 0, 0) for _ in range(rng.randrange(0, 3))],
    )  # fmt: skip
    n_ops = rng.randrange(0, 12)
    n_lay = rng.randrange(0, 4)
    return Compute(
        step=index, ubatch=0, graph=None, start=t(), dur=rng.randrange(0, 300), n_tokens=1,
        n_threads=1, status=0,
        layers=[LayerSpan(rng.randrange(0, 3), t(), rng.randrange(0, 99), 1) for _ in range(n_lay)],
        op_node=np.array([rng.randrange(0, 40) for _ in range(n_ops)], np.int64),
        op_start=np.array([t() for _ in range(n_ops)], np.int64),
        op_dur=np.array([rng.randrange(0, 50) for _ in range(n_ops)], np.int64),
        place=place if rng.random() < 0.9 else None,
        layer_device=(np.array([rng.choice([-1, 0, 1, 2]) for _ in range(n_lay)], np.int64)
                      if rng.random() < 0.7 else None),
    )  # fmt: skip


def _step(rng: random.Random, index: int) -> Step:
    t0 = 1_000_000 + 1000 * index + rng.randrange(0, 2000)  # (steps may overlap in time)
    s = Step(index=index % 5, ctx=1, kind=rng.choice(["gen", "prompt"]), n_tokens=rng.randrange(1, 9),
             pos=(0, 0), start=t0, dur=rng.choice([0, rng.randrange(0, 300)]))  # fmt: skip
    s.computes = [_compute(rng, t0, index) for _ in range(rng.randrange(0, 3))]
    for _ in range(rng.randrange(0, 3)):
        rows = []
        for _ in range(rng.randrange(0, 5)):
            q = t0 + rng.randrange(-20, 400)
            st = q + rng.randrange(0, 30)
            e = st + rng.choice([0, rng.randrange(0, 200)])
            rows.append(TransferRow(rng.choice([-1, 1, 2]), "set_tensor", "t", rng.randrange(0, 99),
                                    rng.randrange(0, 500), rng.randrange(0, 500), q, st, st, e))  # fmt: skip
        s.transfers.append(Transfers("step", 1, index, 0, rows))
    return s


def _expected(steps: list[Step], devs: dt.Devices) -> tuple[list[tuple], list[tuple]]:
    dev_rows, tok_rows = [], []
    for s in steps:
        st = dt.step_time(s, devs)
        for d in devs.order(st.devices):
            x = st.devices[d]
            dev_rows.append(
                (st.step, st.kind, d if d in (0, 1, 2) else 3, x.timed, x.compute_ns, x.share, x.op_ns, x.n_ops, x.layer_ns,
                 len(x.layers), x.outstanding_ns, x.idle_ns, x.gap_ns, x.wait_ns, x.copy_in_bytes,
                 x.copy_out_bytes, x.copy_ns, x.sent_bytes, x.recv_bytes, x.data_bytes, x.net_ns,
                 x.n_cmds, x.transfer_bytes, x.transfer_ns)
            )  # fmt: skip
        tok_rows.append(
            (st.step, st.kind, st.n_tokens, st.start, st.token_ns, st.compute_ns, st.transfer_ns,
             st.host_ns)
        )  # fmt: skip
    return dev_rows, tok_rows


@pytest.mark.parametrize("seed", range(40))
def test_step_times_as_step_time(seed: int) -> None:
    rng = random.Random(seed)
    info = _info()
    b = DeviceBuilder(info)
    steps = [_step(rng, k) for k in range(rng.randrange(8, 30))]
    n_lay = 0
    lay_rows = []
    op_durs: list[int] = []  # the ops table's durations (the op figures are summed from them)
    for s in steps:  # as frames' builder calls it
        for c in s.computes:
            if len(c.layers):
                b.layers(c)
                n_lay += len(c.layers)
                lay_rows += [(x.layer, x.dur) for x in c.layers]
            if len(c.op_node):
                b.ops(c)
                op_durs += c.op_dur.tolist()
        b.step(s)
    ops = pd.DataFrame({"dur_ns": np.array(op_durs, np.int64)})
    layers = pd.DataFrame(lay_rows or np.zeros((0, 2), np.int64), columns=["layer", "dur_ns"])
    # the device index of each name (the tables name devices; one the machine lacks: 3)
    names = {dt.Devices(info)[d["index"]].name: d["index"] for d in DEVICES}
    t = b.tables(ops, layers)
    got = [
        (int(r[0]), r[1], names.get(r[2], 3), bool(r[3]), *[v if isinstance(v, float) else int(v) for v in r[4:]])
        for r in t["device_steps"].itertuples(index=False)
    ]  # fmt: skip
    tok = [(int(r[0]), r[1], *map(int, r[2:])) for r in t["token_time"].itertuples(index=False)]
    dev_rows, tok_rows = _expected(steps, dt.Devices(info))
    assert tok == tok_rows
    assert len(got) == len(dev_rows) > 0
    assert got == dev_rows


def test_union_measure() -> None:
    key = [0, 0, 0, 2, 2, 1]
    a = [0, 5, 3, 10, 10, 7]
    b = [4, 9, 6, 20, 10, 7]  # key 2: one empty; key 1: only an empty one
    # key 0: [0,4) [3,6) [5,9) -> [0,9); key 2: [10,20)
    assert union_measure(key, a, b, 4).tolist() == [9, 0, 10, 0]
    # spans too long to pack the keys apart in int64: the same, key by key
    big = 1 << 61
    assert union_measure([1, 0, 1], [0, 5, big], [big, 9, big + 4], 2).tolist() == [4, big + 4]


def test_distinct_and_lookup_are_unique_and_searchsorted() -> None:
    """The counted ``_distinct`` and the table ``_Lookup`` give what ``np.unique`` and
    ``np.searchsorted`` give: dense and sparse values, negatives, and values not held."""
    rng = np.random.default_rng(7)
    cases = [
        rng.integers(-3, 5, 1000),  # dense, a few devices (-1: none)
        rng.integers(0, 50_000, 200),  # sparse: np.unique itself
        np.array([2**40, -(2**40), 0]),  # a range too wide for a table
        np.zeros(0, np.int64),
    ]
    for a in cases:
        a = a.astype(np.int64)
        got = _distinct(a)
        assert got.dtype == np.int64
        assert np.array_equal(got, np.unique(a))
        if not len(got):
            continue
        look = _Lookup(got)
        held = rng.choice(got, 300)
        assert np.array_equal(look(held), np.searchsorted(got, held))
        # values between, below and above those held: the insertion points, as searchsorted
        odd = np.concatenate([held, [int(got[0]) - 1, int(got[-1]) + 1]])
        if len(got) > 1 and got[1] - got[0] > 1:
            odd = np.concatenate([odd, [int(got[0]) + 1]])
        assert np.array_equal(look(odd), np.searchsorted(got, odd))
