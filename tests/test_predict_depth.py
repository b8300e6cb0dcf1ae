"""instr predict at a context depth no log ran: attention measured at that depth by the probe,
or (--no-probe, another machine's logs) priced per KV cell.

With the probe, each attention op beyond the logs' KV cells costs its price at the logs' most
cells plus what the probe measured it to take more at the target's: checked against the probe
called here, and the probe against a real run's op at depth. Without it, the KQ and KQV matmuls
and the softmax work on every cell the compute reads, so a generation step's price is affine in
them; flash attention's CPU kernel skips the cells a row's mask hides, so its price is fitted per
row and per cell the rows see. Checked here on real runs of a tiny model (the shape of the
prices, worked out from the model's own figures or from made-up ones); how close they come to
real runs at 512 to 4096 is bench/predict.py's depth grid.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import assert_one_line_error, instr, make_run


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from helpers.tiny_gguf import write_tiny_model

    d = tmp_path_factory.mktemp("depth")
    return write_tiny_model(d / "tiny-8k.gguf", arch="llama", seed=11, n_ctx_train=8192)


@pytest.fixture(scope="module")
def short_logs(
    instr_api: Any, deep_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[bool, Path]:
    """A short prompt and 12 generated tokens, flash attention off and on (256 KV cells); with
    it, a prompt of a few tokens, whose computes' rows see 15 cells at most (of the 256 read)."""
    d = tmp_path_factory.mktemp("depth-logs")
    return {
        fa: make_run(
            deep_model, d / f"fa{int(fa)}.log", "detailed", n_predict=12, flash_attn=fa,
            **({"prompt": "Hi"} if fa else {}),
        ).log_path
        for fa in (False, True)
    }  # fmt: skip


def _gen_ns(log: Path, depth: int, *more: str) -> tuple[float, dict[str, Any]]:
    """Predicted ns per generated token at ``depth`` (one token), and the JSON; ``more``: the
    command's other options (--no-probe)."""
    r = instr("predict", str(log), "--ctx-depth", str(depth), "-n", "1", "--format", "json", *more)
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    return 1e9 / doc["gen_tokens_per_s"]["value"], doc


def test_attention_beyond_the_logs_cells_is_priced_per_cell(short_logs: dict[bool, Path]) -> None:
    """With --no-probe, without flash attention one generated token at 512, 768 and 1024 KV
    cells (depths 300, 600 and 850 after the log's prompt) costs the same more per 256 cells:
    every other op is the same size. Each is labelled an extrapolation naming how far (2x, 3x, 4x the log's 256
    cells), with an interval at least the bench's depth error (x/÷ e^0.18) wide."""
    log = short_logs[False]
    prompt = json.loads(instr("predict", str(log), "--format", "json").stdout)["setting"][
        "n_prompt"
    ]
    depths = [d - prompt - 1 for d in (512, 768, 1024)]
    got = [_gen_ns(log, d, "--no-probe") for d in depths]
    t = [ns for ns, _doc in got]
    assert t[0] < t[1] < t[2]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-6)
    for (_ns, doc), far in zip(got, ("2x", "3x", "4x"), strict=True):
        lines = doc["extrapolated"]
        assert any(
            "generation's attention" in x and f"up to {far} the 256 KV cells" in x for x in lines
        ), lines
        iv = doc["gen_tokens_per_s"]
        assert iv["high"] / iv["value"] >= math.exp(0.18) - 1e-9
        assert doc["not_covered"] == []
    text = instr("predict", str(log), "--ctx-depth", str(depths[0]), "--no-probe").stdout
    assert "extrapolat" in text and "measured:" not in text


def test_beyond_what_the_bench_checks_is_not_covered(short_logs: dict[bool, Path]) -> None:
    """Priced per cell (--no-probe), 17x the log's 256 cells (4352) is the bound: a depth of
    5000 reads 5120 (20x), not predicted, the run that measures it named; past n_ctx_train
    (8192), refused, probe or not."""
    log = short_logs[False]
    r = instr("predict", str(log), "--ctx-depth", "5000", "--format", "json", "--no-probe")
    assert r.returncode == 2, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["gen_tokens_per_s"] is None
    line = next(x for x in doc["not_covered"] if "generation's attention reads 20x" in x)
    assert "beyond the 17x" in line and "instr run" in line
    r = instr("predict", str(log), "--ctx-depth", "9000")
    assert_one_line_error(r, "n_ctx_train")


def test_flash_attention_is_priced_by_the_cells_its_rows_see(short_logs: dict[bool, Path]) -> None:
    """Priced per cell (--no-probe), with flash attention one token 250 cells deeper costs, in
    every layer, 250 times the fitted cost per cell more (the cells its row sees, one per
    position), whatever the cells its view spans (1024 at both depths here): one line for every
    layer, fitted on the log's generation at 12 different counts."""
    from llamacpp_instr.deciding.prediction import predict

    log = short_logs[True]
    sf = predict.load_session(log)
    model = predict.fit([sf])
    lines = list(model.flash.values())
    assert len(lines) == 1 and lines[0].per_cell >= 0, model.flash
    n_layer = int(sf.info.model.get("n_layer") or 2)
    level = model.level("gen", frozenset({"CPU"}))
    prompt = json.loads(instr("predict", str(log), "--format", "json").stdout)["setting"][
        "n_prompt"
    ]
    a, _ = _gen_ns(log, 800 - prompt, "--no-probe")
    b, doc = _gen_ns(log, 1000 - prompt, "--no-probe")
    assert b - a == pytest.approx(level * n_layer * 200 * lines[0].per_cell, rel=1e-6, abs=1e-3)
    assert any("FLASH_ATTN_EXT" in x for x in doc["extrapolated"])


@pytest.mark.fast
def test_flash_attentions_line_by_hand() -> None:
    """Times made of 100 ns fixed, 40 ns a row and 3 ns a cell seen (a prompt of 9 rows and
    generation at 20 positions) give those back; times that fall with the rows give 0 a row."""
    from llamacpp_instr.deciding.prediction.kv_costs import fit_rows, visible_cells

    assert visible_cells(0, 9) == 45 and visible_cells(100, 1) == 101
    assert visible_cells(10, 3) == 11 + 12 + 13
    rows = np.array([9] + [1] * 20)
    cells = np.array([45] + [10 + k for k in range(20)])
    dur = 100 + 40 * rows + 3 * cells
    line = fit_rows(rows, cells, dur.astype(float), 100.0)
    assert line is not None
    assert (line.per_row, line.per_cell) == (pytest.approx(40.0), pytest.approx(3.0))
    assert line.time(9, 36909) == pytest.approx(100 + 360 + 3 * 36909)
    falling = fit_rows(rows, cells, (100 + 500 / rows + 3 * cells).astype(float), 100.0)
    assert falling is not None and falling.per_row == 0.0 and falling.per_cell > 0
    assert fit_rows(np.array([1, 1]), np.array([5, 5]), np.array([9.0, 9.0]), 1.0) is None


@pytest.mark.fast
def test_each_cpu_flash_attention_path_prices_its_own_computes() -> None:
    """The pin's CPU flash attention takes three paths with their own costs: made-up times of 8 ns
    a cell for one row split over 512 cells or more, 2 ns for rows a row at a time, 0.5 ns in
    tiles of 64 rows. Each path's computes are priced by their own line, where one line through
    all of them (what the prompts' many cells pull to their cost) misses generation at depth by
    more than twice."""
    import pandas as pd

    from llamacpp_instr.deciding.prediction.kv_costs import cpu_path, flash_lines
    from llamacpp_instr.deciding.prediction.op_costs import Where

    paths = [cpu_path(1, 256), cpu_path(1, 257), cpu_path(32, 9000), cpu_path(64, 100)]
    assert paths == ["rows", "split", "rows", "tiled"]
    per_cell = {"split": 8.0, "rows": 2.0, "tiled": 0.5}
    shapes = [(1, 300 + 50 * k) for k in range(30)] + [(1, 10 + k) for k in range(20)]
    shapes += [(32, 32 * 600 + 528 * k) for k in range(4)] + [
        (512, 131328 + 262144 * k) for k in range(4)
    ]
    rows = np.array([r for r, _ in shapes])
    cells = np.array([c for _, c in shapes], dtype=float)
    dur = np.array([100 + 40 * r + per_cell[cpu_path(r, c)] * c for r, c in shapes])
    cpu = Where("CPU", 2)
    obs = pd.DataFrame(
        {"label": "FLASH_ATTN_EXT", "type0": "kv f16", "where": [cpu] * len(shapes),
         "rows": rows, "cells": cells, "dur": dur}
    )  # fmt: skip
    line = flash_lines(obs, {cpu: 100.0})[(cpu, "kv f16")]
    assert set(line.paths) == {"split", "rows", "tiled"}
    for r, c in [(1, 1024.0), (1, 4096.0), (1, 100.0), (32, 40000.0), (512, 600000.0)]:
        want = 100 + 40 * r + per_cell[cpu_path(r, c)] * c
        assert line.time(r, c) == pytest.approx(want, rel=1e-6)
    pooled = line.fixed + line.per_row + line.per_cell * 4096
    assert pooled < 0.5 * line.time(1, 4096.0)
    # logs without the split path (short prompts and a tiled one): generation at depth is priced
    # by the path a row at a time, not by the line the tiles' many cheap cells pull down
    short = obs[[cpu_path(r, c) != "split" for r, c in zip(rows, cells, strict=True)]]
    line = flash_lines(short, {cpu: 100.0})[(cpu, "kv f16")]
    assert "split" not in line.paths
    assert line.time(1, 4096.0) == pytest.approx(100 + 40 + 2.0 * 4096, rel=1e-6)
    # another device keeps the one line: its kernels are not the CPU's
    gpu = Where("Vulkan0", 0)
    assert (
        flash_lines(obs.assign(where=[gpu] * len(shapes)), {gpu: 100.0})[(gpu, "kv f16")].paths
        == {}
    )


def test_the_attention_ops_are_those_on_the_way_between_cache_reads(
    short_logs: dict[bool, Path],
) -> None:
    """Of a log's graph without flash attention, the nodes priced per KV cell are each layer's
    KQ matmul, its softmax and the KQV matmul, not the permute after it; with it, flash
    attention alone."""
    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.deciding.prediction.op_costs import kv_nodes, role

    for fa, want in ((False, {"kq", "kq_soft_max", "kqv"}), (True, {"__fattn__"})):
        sf = predict.load_session(short_logs[fa])
        g = next(iter(sf.graphs.values()))
        marked = {role(g.nodes[k].name) for k in np.flatnonzero(kv_nodes(g))}
        ops = {g.nodes[k].op for k in np.flatnonzero(kv_nodes(g))}
        if fa:
            assert ops == {"FLASH_ATTN_EXT"}, marked
        else:
            assert marked == want, marked


@pytest.mark.fast
def test_a_prompt_after_a_depth_pays_no_contexts_start() -> None:
    """A step that starts its context (position 0, the session's first) is left out of the warm
    level and overhead a prompt after a depth is priced at; where every prompt step was one, the
    level is 1 and the overhead the least of the other kinds'."""
    from llamacpp_instr.deciding.prediction.op_costs import CostModel, Where

    cpu = Where("CPU", 2)
    m = CostModel(
        fits={}, roofs={}, fused=set(),
        overhead={(cpu, "prompt"): 5e6, (cpu, "gen"): 2e5},
        overhead_warm={(cpu, "gen"): 2e5},
        self_level={"prompt": 1.5, "gen": 1.1},
        self_level_warm={"gen": 1.1},
    )  # fmt: skip
    assert m.overhead_at(2, "prompt") == 5e6 and m.overhead_at(2, "prompt", warm=True) == 2e5
    assert m.level("prompt", frozenset({"CPU"})) == 1.5
    assert m.level("prompt", frozenset({"CPU"}), warm=True) == 1.0
    assert m.level("gen", frozenset({"CPU"}), warm=True) == 1.1


def test_attention_at_depth_is_measured_by_the_probe(short_logs: dict[bool, Path]) -> None:
    """On the logs' machine a depth beyond their cells is priced with the probe: each attention
    op (flash attention; or KQ, its softmax and KQV) measured at the target's cells and at the
    logs' most (256; flash attention, which skips the cells a row's mask hides, at a position
    whose row sees no more cells than the log's computes did), per layer, and a generated token
    at the deep cell costs what one there costs plus those measured differences over the model's
    layers, unscaled. It is no extrapolation: 20x the log's cells is predicted too, as far as
    n_ctx_train."""
    for fa, ops in ((True, {"FLASH_ATTN_EXT"}), (False, {"kq", "kq_soft_max", "kqv"})):
        log = short_logs[fa]
        doc0 = json.loads(instr("predict", str(log), "--format", "json").stdout)
        prompt = doc0["setting"]["n_prompt"]
        n_layer = int(predict_session(log).info.model.get("n_layer") or 2)
        # one token at the log's 256 cells (no probe: nothing beyond the logs), then at 2,000
        near, _ = _gen_ns(log, 200 - prompt)
        deep, doc = _gen_ns(log, 2000 - prompt)
        m = doc["measured_attention"]["gen"]
        assert {o["op"] for o in m["ops"]} == ops
        assert all(o["n_kv"] == 2048 and o["anchor_n_kv"] == 256 for o in m["ops"])
        over = n_layer * sum(1e3 * (o["us_a_layer"] - o["anchor_us_a_layer"]) for o in m["ops"])
        assert m["ns"] == pytest.approx(over, rel=1e-6)
        if fa:
            # flash attention's time is in the cells its rows see: its anchor is a row at a
            # position the log's computes saw (priced as the log measured it, not carried)
            at = {o["anchor_pos0"] for o in m["ops"]}
            assert len(at) == 1 and prompt <= min(at) and max(at) + 1 <= _most_cells_seen(log)
            near, _ = _gen_ns(log, min(at) - prompt)
        assert deep == pytest.approx(near + over, rel=1e-6)
        assert not [x for x in doc["extrapolated"] if "attention" in x], doc["extrapolated"]
        iv = doc["gen_tokens_per_s"]
        assert iv["high"] / iv["value"] >= math.exp(0.18) - 1e-9
        r = instr("predict", str(log), "--ctx-depth", "5000", "--format", "json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["measured_attention"]["gen"]["ops"]


def _most_cells_seen(log: Path) -> int:
    """The most KV cells one compute of the log had its query rows see, summed over its rows
    (``kv_costs.visible_cells``: causal, one sequence)."""
    from llamacpp_instr.deciding.prediction.kv_costs import visible_cells

    frames = predict_session(log)
    return max(
        visible_cells(int(p), int(n))
        for n, p in frames.steps[["n_tokens", "pos0"]].itertuples(index=False)
    )


def predict_session(log: Path) -> Any:
    from llamacpp_instr.deciding.prediction import predict

    return predict.load_session(log)


def test_the_probe_takes_what_a_run_at_depth_takes(instr_api: Any, deep_model: Path) -> None:
    """The probe's time for each attention op at 3,000 cells is within a factor 2.5 of the same
    op's time in a real run at that depth (the op timer's, the median of its generated tokens'
    layers, as the probe counts the median of its computes), flash attention on and off: the
    same kernels on the same shapes, where a wrong shape (the cells its view spans, the heads)
    would be several times off. The probe's caches hold what a token of this model reads (its
    weights and its 2 layers' caches, a few MiB), as warm in a last-level cache as in the run: a
    probe over 256 MiB of caches read them cold, 2.5x the run's time. (No threshold on speed itself, and a wide factor: two shared
    cores' runs move by half from one minute to the next; bench/predict.py's depth grid checks
    the predictions.)"""
    import llama_cpp

    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.analysis.probe_shapes import attention_shape
    from llamacpp_instr.deciding.prediction.op_costs import role
    from llamacpp_instr.running import api
    from llamacpp_instr.running.probes import kv_probe

    devs = {d["name"]: d["index"] for d in instr_api.machine_info()["devices"]}
    weights = deep_model.stat().st_size
    for fa in (True, False):
        llm = llama_cpp.Llama(
            str(deep_model), n_ctx=3328, n_batch=512, n_ubatch=512, n_threads=2,
            n_threads_batch=2, flash_attn=fa, verbose=False,
        )  # fmt: skip
        llm.eval([1 + (i * 7) % 200 for i in range(3000)])
        log = deep_model.parent / f"deep-fa{int(fa)}.log"
        with api.session(llm, log, level="detailed"):
            for _ in range(8):
                llm.eval([5])
        llm.close()
        frames = load_session(log)
        g = frames.graphs[int(frames.ops["graph"].iloc[-1])]
        ops = frames.ops.assign(role=frames.ops["name"].map(role))
        checked = set()
        for k, node in enumerate(g.nodes):
            shape = attention_shape(g, k, role(node.name))
            if shape is None or shape.op in checked:
                continue
            checked.add(shape.op)
            real = float(ops[ops["role"] == role(node.name)]["dur_ns"].median())
            # the fastest of up to three probes (each a fresh one: a probe keeps what it
            # measured): a build running beside the suite once slowed a single probe 3.2x
            tries = []
            for _ in range(3):
                tries.append(
                    kv_probe.Probe(instr_api, devs, 2, 3328, weights, 2).ns(shape, 3004, "CPU")
                )
                if tries[-1] is not None and tries[-1] / real < 2.5:
                    break
            measured = min((t for t in tries if t is not None), default=None)
            assert measured is not None and 0.4 < measured / real < 2.5, (shape, tries, real)
        want = {"FLASH_ATTN_EXT"} if fa else {"kq", "kq_soft_max", "kqv"}
        assert checked == want


def test_another_machines_logs_are_priced_per_cell(
    short_logs: dict[bool, Path], tmp_path: Path
) -> None:
    """Logs made on another machine (their CPU named otherwise) leave the probe out: what it
    would measure here is not what they ran on. Attention beyond their cells is then priced per
    cell, an extrapolation said so."""
    lines = short_logs[True].read_text().splitlines()
    start = json.loads(lines[0])
    start["machine"]["cpu"] = "another CPU"
    moved = tmp_path / "moved.log"
    moved.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    _ns, doc = _gen_ns(moved, 1500)
    assert doc["measured_attention"] == {}
    assert any("generation's attention" in x for x in doc["extrapolated"]), doc["extrapolated"]
