"""``instr predict``'s answer (``prediction.entry.PredictResult``) as a report: per setting, the
predicted tokens/s with their intervals, where the time goes and what no log covered; or
speculative decoding at every draft length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamacpp_instr.converters.reports.report import Fact, Report, Section
from llamacpp_instr.deciding.plan_report import busy_logs
from llamacpp_instr.deciding.prediction.entry import PredictResult
from llamacpp_instr.deciding.prediction.intervals import Interval
from llamacpp_instr.deciding.prediction.predict import Prediction


def report(result: PredictResult) -> Report:
    if result.speculation is not None:
        return speculation_report(result.speculation)
    return Report(
        title="Prediction (instr predict)",
        warnings=busy_logs(result.predictions),
        sections=[section(p) for p in result.predictions],
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
    lines += [f"not covered: {line}" for line in p.not_covered]
    return Section(
        title=f"prediction for {p.target.describe()}",
        text="\n".join(lines),
    )


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
    if iv.basis == "thread bounds":
        return (
            "at a thread count no log ran, the intervals span every op scaling with the threads "
            "to none doing so."
        )
    return (
        "no log could be predicted from the others: the intervals are the model's error on the "
        "project's benchmark grids (x/÷ 1.22) or the logs' own steps' spread, the wider (add "
        "logs of other settings for intervals from these logs)."
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
