"""instr plan on a tiny model (issue 36): the settings that fit a memory limit, ranked by
predicted speed, with the Pareto front marked and a command that runs each. Checked against the
memory itself (the first setting runs under a budget of that memory) and against the ranking's
own definition, computed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.support import RunLog, instr

MIB = 1 << 20


def _plan(model: Path, log: Path, *args: str) -> list[dict[str, Any]]:
    r = instr("plan", str(model), str(log), "--ctx", "512", "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out, list) and out
    return out


def test_ranked_by_predicted_speed_with_the_front(
    tiny_detailed: RunLog, tiny_llama_f32: Path
) -> None:
    plans = _plan(tiny_llama_f32, tiny_detailed.path)
    covered = [p for p in plans if p["fits"] and p["gen_tokens_per_s"] and not p["not_covered"]]
    assert covered, plans
    # covered settings first, by predicted generation speed
    gens = [p["gen_tokens_per_s"]["value"] for p in covered]
    assert gens == sorted(gens, reverse=True)
    assert plans[: len(covered)] == covered

    # the front: none of it is dominated by another covered setting, and every setting off it is
    def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
        ka = (-a["bytes"], a["gen_tokens_per_s"]["value"], a["prompt_tokens_per_s"]["value"])
        kb = (-b["bytes"], b["gen_tokens_per_s"]["value"], b["prompt_tokens_per_s"]["value"])
        return all(x >= y for x, y in zip(ka, kb, strict=True)) and ka != kb

    for p in covered:
        dominated = any(dominates(o, p) for o in covered if o is not p)
        assert p["pareto_front"] == (not dominated), p
    # the log ran llama.cpp's defaults, an f16 cache (flash attention auto: on), and so do the
    # f16 settings; the q8_0 ones (flash attention on a q8_0 cache) are listed as not covered,
    # never priced
    assert {p["flash_attn"] for p in plans if p["type_k"] == "f16"} == {"auto"}
    q8 = [p for p in plans if p["type_k"] == "q8_0"]
    assert q8 and all(p["not_covered"] and p["gen_tokens_per_s"] is None for p in q8 if p["fits"])


def test_what_fits_runs_under_that_memory(
    tiny_detailed: RunLog, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """With a limit between the settings' footprints, the ones over it are marked as not fitting,
    and the first setting's own command runs under a memory budget of the limit."""
    plans = _plan(tiny_llama_f32, tiny_detailed.path)
    sizes = sorted({p["bytes"] for p in plans})
    assert len(sizes) >= 2  # ubatch sizes and cache types take different memory
    limit = (sizes[0] + sizes[-1]) // 2
    limited = _plan(tiny_llama_f32, tiny_detailed.path, "--memory", f"CPU={limit}")
    for p in limited:
        assert p["fits"] == (p["bytes"] <= limit), p
    assert not limited[-1]["fits"]
    first = limited[0]
    assert first["fits"]
    cmd = first["command"].split()
    assert cmd[:3] == ["instr", "run", str(tiny_llama_f32)]
    log = tmp_path / "first.log"
    r = instr(*cmd[1:], "-n", "4", "-p", "hello", "-o", str(log), "--memory-budget", f"CPU={limit}")
    assert r.returncode == 0, r.stderr
    assert log.stat().st_size > 0


def test_nothing_fits_exits_3(tiny_detailed: RunLog, tiny_llama_f32: Path) -> None:
    r = instr("plan", str(tiny_llama_f32), str(tiny_detailed.path), "--memory", "CPU=1M")
    assert r.returncode == 3, r.stderr
    assert "nothing fits" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_a_log_is_one_line(tiny_llama_f32: Path) -> None:
    r = instr("plan", str(tiny_llama_f32))
    assert r.returncode == 2
    assert "detailed log" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_quality_joins_the_front(
    instr_api: Any, tiny_detailed: RunLog, tiny_llama_f32: Path, tiny_llama_q8: Path, tmp_path: Path
) -> None:
    """With a real quant-eval report of the f32 base and its Q8_0, and a log of each, every
    setting carries its quantization's KL divergence (the base's 0, the Q8_0's the report's), and
    a Q8_0 setting, smaller but less faithful, can only leave the front by being slower too."""
    from helpers.support import make_run

    q8_log = make_run(tiny_llama_q8, tmp_path / "q8.log", "detailed", n_predict=6).log_path
    r = instr(
        "quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunk-size", "64",
        "--chunks", "2", "--threads", "2", "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = tmp_path / "quality.json"
    report.write_text(r.stdout)
    q8_kld = json.loads(r.stdout)["models"][0]["kld"]["mean"]
    assert q8_kld > 0
    plans = _plan(
        tiny_llama_f32,
        tiny_detailed.path,
        str(q8_log),
        "--quant",
        "f32",
        "--quant",
        "q8_0",
        "--quality",
        str(report),
    )
    by_quant = {p["quant"]: p for p in plans if p["fits"] and not p["not_covered"]}
    assert set(by_quant) == {"f32", "q8_0"}, plans
    assert all(p["kld_mean"] == (0.0 if p["quant"] == "f32" else q8_kld) for p in by_quant.values())
    covered = [p for p in plans if p["fits"] and not p["not_covered"]]
    for p in covered:
        beaten = [
            o
            for o in covered
            if o is not p
            and o["bytes"] <= p["bytes"]
            and o["kld_mean"] <= p["kld_mean"]
            and o["gen_tokens_per_s"]["value"] >= p["gen_tokens_per_s"]["value"]
            and o["prompt_tokens_per_s"]["value"] >= p["prompt_tokens_per_s"]["value"]
        ]
        strictly = [
            o
            for o in beaten
            if (o["bytes"], o["kld_mean"], o["gen_tokens_per_s"]["value"])
            != (p["bytes"], p["kld_mean"], p["gen_tokens_per_s"]["value"])
            or o["prompt_tokens_per_s"]["value"] != p["prompt_tokens_per_s"]["value"]
        ]
        assert p["pareto_front"] == (not strictly), p
    # the least divergent setting (the base's, at its smallest) is always on the front
    smallest_base = min((p for p in covered if p["quant"] == "f32"), key=lambda p: p["bytes"])
    fastest = max(
        (p for p in covered if p["quant"] == "f32" and p["bytes"] == smallest_base["bytes"]),
        key=lambda p: (p["gen_tokens_per_s"]["value"], p["prompt_tokens_per_s"]["value"]),
    )
    assert fastest["pareto_front"]


def test_a_bad_quality_file_is_one_line(
    tiny_detailed: RunLog, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = instr("plan", str(tiny_llama_f32), str(tiny_detailed.path), "--quality", str(bad))
    assert r.returncode == 2
    assert "quant-eval" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_table_ranks_what_is_covered_with_intervals_at_its_decimals(
    tiny_detailed: RunLog, tiny_llama_f32: Path
) -> None:
    """The text table numbers the covered settings 1, 2, ... in the JSON's order, gives the
    settings not covered no rank ("-"), and prints each interval with the value's decimal."""
    import re

    plans = _plan(tiny_llama_f32, tiny_detailed.path)
    r = instr("plan", str(tiny_llama_f32), str(tiny_detailed.path), "--ctx", "512")
    assert r.returncode == 0, r.stderr
    rows = [x for x in r.stdout.splitlines() if "instr run" in x]
    fits = [p for p in plans if p["fits"]]
    assert len(rows) == len(fits)
    covered = [p for p in fits if p["gen_tokens_per_s"] and not p["not_covered"]]
    assert covered and len(covered) < len(fits)  # the q8_0 cache settings are not
    rate = r"(\d+\.\d) \((\d+\.\d)-(\d+\.\d)\)"
    for k, (row, p) in enumerate(zip(rows, fits, strict=True)):
        assert row.endswith(p["command"])
        if p in covered:
            assert row.split()[0] == str(k + 1), row
            found = re.findall(rate, row)
            assert len(found) == 2, row  # generation's and the prompt's
            gen = p["gen_tokens_per_s"]
            assert found[0] == tuple(f"{gen[x]:.1f}" for x in ("value", "low", "high"))
        else:
            assert row.split()[0] == "-", row
            assert not re.findall(rate, row)


def _candidate(mib: int, speed: float, kld: float | None, type_k: str = "f16") -> Any:
    """A fitting, covered setting of ``mib`` MiB running prompt and generation at ``speed``."""
    from llamacpp_instr.deciding.plan import Candidate
    from llamacpp_instr.deciding.prediction.intervals import Interval
    from llamacpp_instr.deciding.prediction.target import Prediction, Target

    t = Target(Path("m.gguf"), 2, 8, 8, 0, 512, 512)
    p = Prediction(target=t, logs=[], prompt=Interval(speed, speed, speed))
    p.gen = Interval(speed, speed, speed)
    c = Candidate("q8_0", Path("q8.gguf"), 2, 512, type_k, type_k, type_k != "f16", 0, 512)
    c.footprint, c.prediction, c.kld = {"CPU": {"weights": mib * MIB}}, p, kld
    return c


@pytest.mark.fast
def test_the_front_compares_quality_where_both_have_it() -> None:
    """A KV cache's quality joins the front (issue 53 §7): of settings whose quality was
    measured, the front is by memory, speed and KL divergence; one whose quality was not is
    compared only with others like it (what it loses is not known), and the quant-eval run that
    measures it is named. Worked by hand: A (100 MiB, 0.01) and B (90 MiB, 0.05) trade memory
    for quality; D (95 MiB, slower, 0.06) is beaten by B; C (90 MiB, q4_0 KV unmeasured) stands
    alone among the unmeasured, E (95 MiB, slower, unmeasured) is beaten by C."""
    from llamacpp_instr.deciding.plan import mark_front, unmeasured_quality

    a, b = _candidate(100, 10, 0.01), _candidate(90, 10, 0.05, "q8_0")
    c, d = _candidate(90, 10, None, "q4_0"), _candidate(95, 9, 0.06, "q8_0")
    e = _candidate(95, 9, None, "q4_0")
    mark_front([a, b, c, d, e])
    assert [x.front for x in (a, b, c, d, e)] == [True, True, True, False, False]
    (line,) = unmeasured_quality([a, b, c, d, e], "base.gguf")
    assert line.startswith("q8_0 with a q4_0/q4_0 KV cache: `instr quant-eval base.gguf q8.gguf")
    assert "-ctk q4_0 -ctv q4_0 --flash-attn --format json`" in line
    # without any quality, the front is memory and speed alone: A is beaten by B
    for x in (a, b, d):
        x.kld = None
    mark_front([a, b, c, d, e])
    assert [x.front for x in (a, b, c, d, e)] == [False, True, True, False, False]
    assert unmeasured_quality([a, b, c, d, e], "base.gguf") == []


def test_quality_is_by_quantization_and_kv_cache(
    instr_api: Any, tiny_llama_f32: Path, tiny_llama_q8: Path
) -> None:
    """A quant-eval report's models by their GGUF's own type and the KV cache they were evaluated
    with (f16 where a report does not say: those made before -ctk/-ctv); the base's is 0."""
    from llamacpp_instr.deciding.plan import quality
    from llamacpp_instr.running.quant.files import file_type

    report = {
        "base": {"path": str(tiny_llama_f32)},
        "models": [
            {"path": str(tiny_llama_q8), "kld": {"mean": 0.1}},
            {
                "path": str(tiny_llama_f32),
                "type_k": "q8_0",
                "type_v": "q4_0",
                "kld": {"mean": 0.02},
            },
        ],
    }
    assert quality(report, file_type) == {
        ("f32", "f16", "f16"): 0.0,
        ("q8_0", "f16", "f16"): 0.1,
        ("f32", "q8_0", "q4_0"): 0.02,
    }
