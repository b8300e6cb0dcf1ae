"""Issue 52 §5: a mixture of experts' routing in the trace (a counter of the experts each layer
used, per compute) and per request of a server, checked against the log's experts records read
apart (tests/support.read_log)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support import by_type, make_run, read_log

from llamacpp_instr.cli import main

N_EXPERT = 8


@pytest.fixture(scope="module")
def small_detailed(
    moe_small: Path, instr_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("moe_views") / "small.log"
    make_run(moe_small, out, "detailed", n_predict=4)
    return out


def _used_per_compute(recs: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Per layer, in log order: the number of experts each compute's router sent tokens to."""
    out: dict[int, list[float]] = defaultdict(list)
    for r in by_type(recs, "experts"):
        used: dict[int, set[int]] = defaultdict(set)
        for layer, e, tokens, _ in r["rows"]:
            if tokens:
                used[layer].add(e)
        for layer in sorted(used):
            out[layer].append(float(len(used[layer])))
    return dict(out)


def test_the_trace_counts_each_layers_experts_per_compute(
    small_detailed: Path, tmp_path: Path
) -> None:
    from test_perfetto import check_trace

    want = _used_per_compute(read_log(small_detailed))
    assert sorted(want) == [0, 1, 2, 3]
    out = tmp_path / "t.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(small_detailed), "-o", str(out)])
    assert r.exit_code == 0, r.output
    counters = check_trace(out)["counters"]
    got = {int(k.rsplit(" ", 1)[1]): v for k, v in counters.items() if k.startswith("experts used")}
    assert got == want
    # a generated token goes to 2 of the 8 experts of each layer
    assert all(v[-1] == 2.0 for v in got.values())
    # one layer selected: its track only; Chrome JSON: the same samples
    r = CliRunner().invoke(
        main, ["to-perfetto", str(small_detailed), "-o", str(out), "--layer", "2"]
    )
    assert r.exit_code == 0, r.output
    names = [k for k in check_trace(out)["counters"] if k.startswith("experts used")]
    assert names == ["experts used: layer 2"]
    js = tmp_path / "t.json"
    r = CliRunner().invoke(
        main, ["to-perfetto", str(small_detailed), "-o", str(js), "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    events = json.loads(js.read_text())
    samples: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "C" and e["name"].startswith("experts used"):
            samples[int(e["name"].rsplit(" ", 1)[1])].append(e["args"]["experts"])
    assert dict(samples) == want


def test_a_log_without_routing_has_no_expert_track(small_detailed: Path, tmp_path: Path) -> None:
    from test_perfetto import check_trace

    bare = tmp_path / "bare.log"
    bare.write_text(
        "".join(
            line
            for line in small_detailed.read_text().splitlines(keepends=True)
            if '"type":"experts"' not in line
        )
    )
    out = tmp_path / "bare.pftrace"
    assert CliRunner().invoke(main, ["to-perfetto", str(bare), "-o", str(out)]).exit_code == 0
    assert not [k for k in check_trace(out)["counters"] if k.startswith("experts")]
