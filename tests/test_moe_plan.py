"""Issue 52 §6: where a mixture of experts' expert weights go, ranked (``instr plan --experts``,
``instr fit --experts``), on lavapipe (Vulkan on the CPU): the small MoE test model run at
--n-cpu-moe 0, 2 and 4 with every layer on Vulkan0.

Checked against facts computed apart: the expert tensors' sizes in the GGUF (gguf-py), the
buffers each placement's real run holds (its log's weight inventory), and the memory limit given.
The accuracy of the ranking's speeds is a bench's (bench/moe_placement.py), not a test's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.support import PROMPT, by_type, instr, read_log
from helpers.vulkan_backend import vulkan_device, vulkan_env

pytestmark = pytest.mark.vulkan

N_LAYER = 4
EXPS = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate)_exps\.weight$")


def _run(model: Path, log: Path, *placement: str) -> None:
    r = instr(
        "run", str(model), "-ngl", "99", *placement, "--level", "detailed", "-o", str(log),
        "-n", "4", "-t", "2", "-p", PROMPT, "--ignore-eos", env=vulkan_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def vk_logs(moe_small: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    vulkan_device()
    out = tmp_path_factory.mktemp("moe_plan")
    logs = {}
    for n in (0, 2, N_LAYER):
        logs[n] = out / f"n{n}.log"
        _run(moe_small, logs[n], "--n-cpu-moe", str(n))
    return logs


def _layer_bytes(model: Path) -> dict[int, int]:
    import gguf

    out: dict[int, int] = {}
    for t in gguf.GGUFReader(str(model)).tensors:
        m = EXPS.match(t.name)
        if m:
            out[int(m.group(1))] = out.get(int(m.group(1)), 0) + int(t.n_bytes)
    return out


def _plan(model: Path, logs: dict[int, Path], *extra: str) -> tuple[int, list[dict[str, Any]]]:
    r = instr(
        "plan", str(model), *map(str, logs.values()), "--experts", "--format", "json", *extra,
        env=vulkan_env(),
    )  # fmt: skip
    assert r.returncode in (0, 3), r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


def test_every_n_cpu_moe_is_ranked_with_its_memory_and_ot_rule(
    moe_small: Path, vk_logs: dict[int, Path]
) -> None:
    code, cands = _plan(moe_small, vk_logs)
    assert code == 0
    by_n = {c["n_cpu_moe"]: c for c in cands if c["n_cpu_moe"] is not None}
    assert sorted(by_n) == list(range(N_LAYER + 1))
    layer_bytes = _layer_bytes(moe_small)
    assert sorted(layer_bytes) == list(range(N_LAYER))
    for n in range(N_LAYER):
        a, b = by_n[n]["footprint"], by_n[n + 1]["footprint"]
        # one more layer's experts leave Vulkan0's weights for the host's: their GGUF bytes
        assert a["Vulkan0"]["weights"] - b["Vulkan0"]["weights"] == layer_bytes[n]
        assert b["CPU"]["weights"] - a["CPU"]["weights"] == layer_bytes[n]
        assert by_n[n + 1]["expert_bytes_cpu"] - by_n[n]["expert_bytes_cpu"] == layer_bytes[n]
    for c in cands:
        assert c["fits"] and c["gen_tokens_per_s"] and not c["not_covered"], c
        assert ("--n-cpu-moe" in c["command"]) == (c["n_cpu_moe"] is not None)
        if c["cpu_layers"]:
            assert c["ot"].endswith("=CPU") and c["ot"] in c["command"] or c["n_cpu_moe"]
        else:
            assert c["ot"] is None
    # fastest generation first (to 4 significant digits: alike ones by their prompt)
    gens = [float(f'{c["gen_tokens_per_s"]["value"]:.4g}') for c in cands]
    assert gens == sorted(gens, reverse=True)


def test_a_memory_limit_leaves_out_what_overflows_it(
    moe_small: Path, vk_logs: dict[int, Path]
) -> None:
    _, cands = _plan(moe_small, vk_logs)
    by_n = {c["n_cpu_moe"]: c for c in cands if c["n_cpu_moe"] is not None}
    # room on Vulkan0 for the placement with the first two layers' experts on the CPU, not less
    limit = sum(by_n[2]["footprint"]["Vulkan0"].values())
    code, cands = _plan(moe_small, vk_logs, "--memory", f"Vulkan0={limit}")
    assert code == 0
    for c in cands:
        vk = sum(c["footprint"]["Vulkan0"].values())
        assert c["fits"] == (vk <= limit), c
        if not c["fits"]:
            assert c["overflow"] == ["Vulkan0"] and c["gen_tokens_per_s"] is None
    assert {c["n_cpu_moe"] for c in cands if c["fits"]} >= {2, 3, 4}
    assert [c["fits"] for c in cands] == sorted((c["fits"] for c in cands), reverse=True)
    code, _ = _plan(moe_small, vk_logs, "--memory", "Vulkan0=1MiB")
    assert code == 3


def test_an_ot_rule_it_prints_places_the_experts_it_says(
    moe_small: Path, vk_logs: dict[int, Path], tmp_path: Path
) -> None:
    from llamacpp_instr.deciding.moe_plan import ExpertPlacement

    for layers in ((1, 3), (2,)):
        rule = ExpertPlacement(layers).ot()
        assert rule is not None
        log = tmp_path / f"ot{len(layers)}.log"
        _run(moe_small, log, "-ot", rule)
        start = by_type(read_log(log), "session_start")[0]
        held = {
            int(m.group(1)): w["buffer"] for w in start["weights"] if (m := EXPS.match(w["name"]))
        }
        assert {la for la, buf in held.items() if buf.startswith("CPU")} == set(layers)
        assert all(buf.startswith("Vulkan0") for la, buf in held.items() if la not in layers)


def test_fit_ranks_the_same_placements(moe_small: Path, vk_logs: dict[int, Path]) -> None:
    r = instr(
        "fit", str(moe_small), "--experts", "--log", str(vk_logs[2]), "--format", "json",
        env=vulkan_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = {c["placement"] for c in json.loads(r.stdout)}
    assert {f"--n-cpu-moe {n}" for n in range(1, N_LAYER + 1)} | {"none"} <= got
    r = instr("fit", str(moe_small), "--log", str(vk_logs[2]), env=vulkan_env())
    assert r.returncode == 2 and "--experts" in r.stderr
