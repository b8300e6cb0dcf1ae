"""Issue 52 §3, §6 on the CPU: a mixture of experts' measured traffic as ``predict`` and ``plan``
price it (``expert_traffic``), an expert matmul's size class, and the placements' rules.

Checked against the log's experts records read apart, the GGUF's expert tensor sizes, and
llama.cpp's own rules (``--n-cpu-moe``'s, common.h)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers.support import FIXTURES, by_type, make_run, read_log

N_EXPERT, N_USED = 8, 2


@pytest.fixture(scope="module")
def small_detailed(
    moe_small: Path, instr_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("moe_traffic") / "small.log"
    make_run(moe_small, out, "detailed", n_predict=4, prompt="The capital of France is a city of")
    return out


def test_the_traffic_is_the_share_of_experts_each_layers_computes_used(
    small_detailed: Path,
) -> None:
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.deciding.prediction.expert_traffic import ExpertTraffic
    from llamacpp_instr.deciding.prediction.op_costs import token_class

    shares: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in by_type(read_log(small_detailed), "experts"):
        per: dict[int, tuple[set[int], int]] = {}
        for layer, e, tokens, _ in r["rows"]:
            used, n = per.get(layer, (set(), 0))
            per[layer] = (used | {e}, n + tokens)
        for layer, (used, n) in per.items():
            assert n % N_USED == 0  # each token went to N_USED experts
            shares[(layer, token_class(n // N_USED))].append(len(used) / N_EXPERT)
    want = {k: sum(v) / len(v) for k, v in shares.items()}
    got = ExpertTraffic.of([load_session(small_detailed)])
    assert got.share == pytest.approx(want)
    # one generated token reads N_USED of the experts; the prompt's last layer computes one row
    assert all(got.share[(la, "1")] == N_USED / N_EXPERT for la in range(4))
    assert any(k[1] != "1" and v > N_USED / N_EXPERT for k, v in got.share.items())


def test_a_graph_is_priced_at_the_experts_its_layers_used(
    small_detailed: Path, moe_small: Path
) -> None:
    import gguf

    from llamacpp_instr.converters import load_session
    from llamacpp_instr.deciding.prediction.expert_traffic import ExpertTraffic
    from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, rows
    from llamacpp_instr.deciding.prediction.predict import fit

    sf = load_session(small_detailed)
    traffic = ExpertTraffic.of([sf])
    whole = {
        t.name.removesuffix(".weight"): int(t.n_bytes)
        for t in gguf.GGUFReader(str(moe_small)).tensors
        if t.name.endswith("_exps.weight")
    }
    gen = int(sf.steps[sf.steps["kind"] == "gen"]["step"].iloc[0])
    gid = int(sf.ops[sf.ops["step"] == gen]["graph"].iloc[0])
    g = sf.graphs[gid]
    gc = GraphCosts.of(g)
    routed = traffic.routed(gc)
    seen = 0
    for k, node in enumerate(g.nodes):
        if node.op != "MUL_MAT_ID":
            assert routed.bytes[k] == gc.bytes[k]
            continue
        seen += 1
        assert rows(node, g) == 1 and gc.tokens[k] == "1"  # one token: its own size class
        layer = int(node.name.rsplit("-", 1)[1])
        part = node.name.split("-")[0].replace("ffn_moe_", "ffn_")
        unread = whole[f"blk.{layer}.{part}_exps"] * (1 - N_USED / N_EXPERT)
        assert gc.bytes[k] - routed.bytes[k] == pytest.approx(unread)
    assert seen == 3 * 4
    # the fit takes the logged ops' routed bytes: the model carries the same traffic
    model = fit([sf])
    assert model.experts is not None and model.experts.share == traffic.share


def test_a_log_without_routing_prices_whole_expert_tensors(
    small_detailed: Path, tmp_path: Path
) -> None:
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.deciding.prediction.predict import fit

    bare = tmp_path / "bare.log"
    bare.write_text(
        "".join(
            line
            for line in small_detailed.read_text().splitlines(keepends=True)
            if '"type":"experts"' not in line
        )
    )
    assert fit([load_session(bare)]).experts is None


@pytest.mark.fast
def test_placements_say_llamas_rules() -> None:
    from llamacpp_instr.deciding.moe_plan import ExpertPlacement, ot_rule
    from llamacpp_instr.running.tensor_overrides import TensorOverrides, parse_override

    for n in range(4):
        p = ExpertPlacement(tuple(range(n)))
        assert p.n_cpu_moe == n
        assert p.tensors() == TensorOverrides.from_options(n_cpu_moe=n or None)
        assert p.args() == ["--n-cpu-moe", str(n)]
    p = ExpertPlacement((1, 3))
    assert p.n_cpu_moe is None and p.label() == "layers 1,3"
    assert ot_rule((1, 3)) == r"blk\.(1|3)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"
    assert p.tensors().rules == parse_override(ot_rule((1, 3)))  # ECMAScript's grammar too
    import re

    pattern = ot_rule((1, 3)).removesuffix("=CPU")
    names = [f"blk.{la}.ffn_{part}_exps.weight" for la in range(12) for part in ("up", "down")]
    hit = {int(n.split(".")[1]) for n in names if re.search(pattern, n)}
    assert hit == {1, 3}  # not blk.11 nor blk.13


@pytest.mark.fast
def test_a_model_without_llamas_expert_tensors_is_one_line() -> None:
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.deciding.moe_plan import expert_layers

    with pytest.raises(UserError, match="no expert tensors") as err:
        expert_layers(load_session(FIXTURES / "tiny-llama-detailed.log.gz"))
    assert "\n" not in str(err.value)
