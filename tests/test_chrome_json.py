"""The Chrome JSON writer in bulk: byte for byte the output of the previous per-event writer.

The reference (tests/reference/chrome_json.py) is the previous ``write_chrome_json`` (one
``orjson.dumps`` per event, from the per-op layout of tests/reference/layout.py). The writer must
give the same bytes from that layout and from the production one (``ComputeBatch`` items),
whatever the selection, on the fixtures, a real log, a bigger log and logs with unusual numbers.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES, REAL_FIXTURES, read_log, synthetic_log, write_log
from reference.chrome_json import reference_write_chrome_json
from reference.layout import layout

from llamacpp_instr.converters.formats.chrome_json import write_chrome_json
from llamacpp_instr.converters.session.fold import iter_events, iter_events_packed
from llamacpp_instr.converters.traces.items import LayoutStats, Selection
from llamacpp_instr.converters.traces.layout import layout_bulk
from llamacpp_instr.converters.traces.rounding import round3
from llamacpp_instr.converters.traces.sinks import ThreadedWriter

SELECTIONS = [
    Selection(),
    Selection(layer=1),
    Selection(layer=0),
    Selection(steps=(1, 3)),
    Selection(ops=False),
    Selection(layer=1, ops=False),
]


def outputs(log: Path, sel: Selection) -> dict[str, bytes]:
    """The reference output, and the new writer's from each kind of layout."""
    res: dict[str, bytes] = {}
    out = io.BytesIO()
    n_ref = reference_write_chrome_json(layout(iter_events(log), sel, LayoutStats()), out)
    res["reference"] = out.getvalue()
    streams: dict[str, Any] = {
        "per-op layout": lambda: layout(iter_events(log), sel, LayoutStats()),
        "bulk layout": lambda: layout_bulk(iter_events_packed(log), sel, LayoutStats()),
    }
    for name, make in streams.items():
        out = io.BytesIO()
        assert write_chrome_json(make(), out) == n_ref, name
        res[name] = out.getvalue()
    return res


def assert_same(log: Path, sels: list[Selection] = SELECTIONS) -> None:
    for sel in sels:
        res = outputs(log, sel)
        ref = res.pop("reference")
        events = json.loads(ref)
        for name, data in res.items():
            assert json.loads(data) == events, (name, sel)  # the same events and args
            assert data == ref, (name, sel)  # and even the same bytes


@pytest.mark.fast
@pytest.mark.parametrize("fixture", REAL_FIXTURES, ids=lambda p: p.name)
def test_same_output_as_reference_on_fixtures(fixture: Path) -> None:
    assert_same(fixture)


def test_same_output_as_reference_on_a_real_log(smollm2_detailed: Any) -> None:
    assert_same(smollm2_detailed.path, [Selection(), Selection(layer=7)])


@pytest.mark.fast
def test_same_output_as_reference_on_a_bigger_log(tmp_path: Path) -> None:
    """Several sessions, ops outside the graph, fused nodes, and more than a write chunk."""
    log = synthetic_log(tmp_path, 120)
    res = outputs(log, Selection())
    assert len(res["reference"]) > 3 * ThreadedWriter.CHUNK
    assert all(data == res["reference"] for data in res.values())


@pytest.mark.fast
def test_timestamps_beyond_float_precision(tmp_path: Path) -> None:
    """Monotonic times past 2**53 ns (a machine up for 105 days): ts / 1000 as Python divides."""
    shift = (1 << 53) + 12_345
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    for r in recs:
        for key in ("ts", "t_start"):
            if key in r:
                r[key] += shift
    log = write_log(tmp_path / "late.log", recs)
    assert_same(log, [Selection()])


@pytest.mark.fast
def test_rates_rounded_as_python_rounds() -> None:
    rng = random.Random(7)
    values = [rng.uniform(0, 10) for _ in range(20_000)]
    values += [rng.uniform(0, 1e6) for _ in range(20_000)]
    values += [k / 1000 + 0.0005 for k in range(5000)]  # next to rounding boundaries
    values += [2.675, 1.0005, 0.0, 123456.7895, 1e15, 3e17]
    got = round3(np.array(values))
    checked = 0
    for v, g in zip(values, got.tolist(), strict=True):
        if not np.isnan(g):  # NaN: the writer asks Python
            assert g == round(v, 3), v
            checked += 1
    assert checked > 40_000


@pytest.mark.fast
def test_write_error_reaches_the_caller(tmp_path: Path) -> None:
    class Full(io.BytesIO):
        def write(self, b: Any) -> int:
            if self.tell() > 2 * ThreadedWriter.CHUNK:
                raise OSError(28, "No space left on device")
            return super().write(b)

    log = synthetic_log(tmp_path, 60)
    items = layout_bulk(iter_events_packed(log), Selection(), LayoutStats())
    with pytest.raises(OSError, match="No space"):
        write_chrome_json(items, Full())


@pytest.mark.fast
def test_cli_json_matches_reference(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    log = FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz"
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == outputs(log, Selection())["reference"]


@pytest.mark.fast
def test_numbers_beyond_64_bits(tmp_path: Path) -> None:
    """A damaged graph table whose shapes make FLOPs beyond 64 bits: those events are written by
    the standard library (as before), and parse to the same events."""
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    for r in recs:
        if r["type"] == "graph":
            for n in r["nodes"]:
                if n["op"] == "MUL_MAT":
                    n["shape"] = [2**40, 2**40]
    log = write_log(tmp_path / "huge.log", recs)
    res = outputs(log, Selection())
    ref = json.loads(res.pop("reference"))
    assert any(e.get("args", {}).get("est_flops", 0) > 2**64 for e in ref)
    for data in res.values():
        assert json.loads(data) == ref
