"""``instr predict``'s answer (``prediction.entry.PredictResult``) as a report: per setting, the
predicted tokens/s with their intervals, where the time goes and what no log covered; or
speculative decoding at every draft length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamacpp_instr.converters.reports.report import Column, Fact, Report, Section, Table
from llamacpp_instr.deciding.plan_report import busy_logs
from llamacpp_instr.deciding.prediction.entry import PredictResult
from llamacpp_instr.deciding.prediction.intervals import Interval
from llamacpp_instr.deciding.prediction.target import Prediction


def report(result: PredictResult) -> Report:
    if result.speculation is not None:
        return speculation_report(result.speculation)
    return Report(
        title="Prediction (instr predict)",
        warnings=busy_logs(result.predictions),
        sections=[section(p) for p in result.predictions] + sampling_section(result),
        data=result.to_json(),
    )


def section(p: Prediction) -> Section:
    lines = [f"prompt: {rate(p.prompt)}", f"generation: {rate(p.gen)}"]
    for kind, name in (("gen", "generation"), ("prompt", "prompt")):
        ops = p.by_op.get(kind)
        if not ops:
            continue
        top = ", ".join(f"{op} {share:.0%}" for op, share in list(ops.items())[:5])
        devs = ", ".join(f"{d} {s:.0%}" for d, s in p.by_device.get(kind, {}).items())
        lines.append(f"where {name} time goes: {top}; by device: {devs}")
    if p.links and any("network" in d for d in p.by_device.values()):
        links = ", ".join(
            f"{d} {lk['rate_bits_per_s'] / 1e6:.4g} Mbit/s, round trip {lk['rtt_ns'] / 1e6:.3g} ms"
            for d, lk in p.links.items()
        )
        lines.append(f"network priced at: {links}")
    lines.append(
        f"from {len(p.logs)} log(s) ({', '.join(Path(x).name for x in p.logs)}); "
        f"{p.graphs} graph(s) built by llama.cpp without weights. A prediction, not a "
        f"measurement; {basis(p)}"
    )
    if p.threads_from:
        lines.append(f"threads: {p.threads_from}")
    lines += [f"priced from other ops: {line}" for line in p.priced_from_others]
    lines += [f"extrapolated: {line}" for line in p.extrapolated]
    for kind, m in p.measured_attention.items():
        # each op once (at the first of its KV sizes)
        seen = {(o["op"], o["rows"]): o for o in reversed(m["ops"])}
        probed = ", ".join(
            f"{o['op']} of {o['rows']} row(s) at {o['n_kv']:,} cells {o['us_a_layer']:.0f} us "
            f"a layer (at {o['anchor_n_kv']:,}: {o['anchor_us_a_layer']:.0f})"
            for o in reversed(seen.values())
        )
        lines.append(
            f"measured: {'the prompt' if kind == 'prompt' else 'generation'}'s attention beyond "
            "the logs' KV cells, run on this machine at its depth (its time there over the "
            f"logs' most cells, added to their price): {probed}"
        )
    if p.measured_matmuls:
        each = ", ".join(f"{w} {v:.2f}x" for w, v in p.measured_matmuls.items())
        lines.append(
            "measured: a generated token's matmuls on this machine at both thread counts, in "
            f"turns (how much faster at {p.target.threads}): {each}"
        )
    lines += [f"not covered: {line}" for line in p.not_covered]
    return Section(
        title=f"prediction for {p.target.describe()}",
        text="\n".join(lines),
    )


SAMPLING_COLUMNS = [
    Column("slots", "slots", "int"),
    Column("sampling_ms_per_token", "sampling a token (ms)", "f3"),
    Column("sampling_ms_per_step", "sampling a step (ms)", "f3"),
    Column("sampling_share_of_step", "share of a generation step", "pct"),
]


def sampling_section(result: PredictResult) -> list[Section]:
    """Sampling as the logs measured it, at 1, 4 and 8 slots, and what would pay."""
    rows = result.sampling_at()
    if not rows:
        return []
    one = rows[0]
    facts = [
        Fact("sampling a token (ms)", one["sampling_ms_per_token"], "f3"),
        Fact(
            "costliest samplers (ms a token)",
            ", ".join(f"{k} {v:.3f}" for k, v in list(one["samplers_ms_per_token"].items())[:4])
            or "not named (the logs are at --level minimal)",
        ),
    ]
    gen = result.predictions[0].gen if result.predictions else None
    if gen is not None and gen.value:
        with_sampling = 1e3 / (1e3 / gen.value + one["sampling_ms_per_token"])
        facts.append(Fact("generation tokens/s with sampling, one slot", with_sampling, "f1"))
    advice = list(dict.fromkeys(a for r in rows for a in r["advice"]))
    return [
        Section(
            title="sampling, as measured",
            facts=facts,
            tables=[Table("sampling", "Sampling by slots", SAMPLING_COLUMNS, rows)],
            text="\n".join(
                [
                    f"from {one['measured']['tokens']:,} tokens sampled on a vocabulary of "
                    f"{one['n_vocab']:,}; slots sample one after the other after each step, so a "
                    "step's sampling grows with them (its share: against the logs' generation "
                    "step)",
                    *advice,
                ]
            ),
        )
    ]


def rate(i: Interval | None) -> str:
    if i is None:
        return "not predicted (not covered)"
    return f"{i.value:.1f} tokens/s ({i.low:.1f} to {i.high:.1f})"


def basis(p: Prediction) -> str:
    """What the intervals are made of (``intervals``)."""
    iv = p.gen or p.prompt
    if iv is None:
        return "nothing predicted."
    if iv.basis == "held-out":
        return (
            f"95 % intervals from how far {iv.held_out} log(s) were from their prediction by the "
            "others (leave one out)."
        )
    return (
        "no log could be predicted from the others: the intervals are the model's error on the "
        f"project's benchmark grids (x/÷ {iv.high / iv.value:.2f} here) or the logs' own steps' "
        "spread, the wider (add logs of other settings for intervals from these logs)."
    )


def speculation_report(doc: dict[str, Any]) -> Report:
    """``spec_predict.run``'s answer: the asked draft length's speed, the fastest, every one."""
    a = doc["asked"]
    acc = ", ".join(f"{x * 100:.0f} %" for x in doc["acceptance_by_position"])
    plain = doc["by_n_max"][0]["gen_tokens_per_s"]
    best = doc["by_n_max"][doc["best_n_max"]]
    fastest = (
        f"--spec-draft-n-max {best['n_max']} ({best['gen_tokens_per_s']:.1f} tokens/s)"
        if best["n_max"]
        else f"no speculation ({plain:.1f} tokens/s): the drafts cost more than they save"
    )
    facts = [
        Fact(
            "generation",
            f"{a['gen_tokens_per_s']:.1f} tokens/s ({a['tokens_per_verify']:.2f} tokens a verify; "
            f"a plain decode {plain:.1f} tokens/s)",
        ),
        Fact("acceptance by draft position (of the verifies that reached it)", acc),
        Fact("fastest", fastest),
        Fact(
            "by n-max",
            ", ".join(f"{p['n_max']}: {p['gen_tokens_per_s']:.1f}" for p in doc["by_n_max"]),
        ),
    ]
    text = (
        f"from {len(doc['logs'])} log(s) at n-max {', '.join(map(str, doc['logs_n_max']))} "
        f"({doc['verifies']:,} verifies). A prediction, not a measurement."
    )
    text += "".join(f"\nextrapolated: {x}" for x in a["extrapolated"])
    title = f"prediction for speculation with {doc['draft']} at --spec-draft-n-max {a['n_max']}"
    return Report(
        title="Prediction (instr predict --spec-draft-n-max)",
        sections=[Section(title=title, facts=facts, text=text)],
        data=doc,
    )
