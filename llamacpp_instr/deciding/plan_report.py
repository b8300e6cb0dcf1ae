"""``instr plan``'s answer (``plan.PlanResult``) as a report: the settings that fit, ranked by
predicted speed, the Pareto front marked, each with the ``instr run`` command that runs it; and
the figures the planners' reports share (a rate with its interval, the logs from a busy machine,
what no log covered)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llamacpp_instr.contract.units import fmt_bytes
from llamacpp_instr.converters.reports.report import Column, Report, Section, Table
from llamacpp_instr.deciding.plan import Candidate, PlanResult
from llamacpp_instr.deciding.prediction.target import Prediction
from llamacpp_instr.running import context_choices


def report(result: PlanResult) -> Report:
    ranked = result.ranked
    fits = [c for c in ranked if c.fits]
    mem = ", ".join(f"{d} {fmt_bytes(n, 'MiB')}" for d, n in result.limits.items())
    notes = []
    missing = not_covered(fits)
    if missing:
        # what no log measured, once each (without the run to make, which names each setting's
        # model: the command in the table is that run)
        notes.append(
            "not covered (unranked: run such a setting's command above at --level detailed "
            "and add its log):"
        )
        notes += [f"  {line}" for line in missing]
    over = [c for c in ranked if not c.fits]
    if over:
        notes.append(
            f"{len(over)} setting(s) do not fit (overflowing "
            f"{', '.join(sorted({d for c in over for d in c.overflow}))})"
        )
    if result.speculation:
        notes.append(speculation_line(result.speculation))
    if result.sampling is not None:
        notes += sampling_lines(result.sampling.at())
    if result.unmeasured:
        notes.append("quality not measured (off the quality front's comparisons):")
        notes += [f"  {line}" for line in result.unmeasured]
    table = Table(
        name="settings",
        title="settings that fit, fastest first (tokens/s with its interval; * = on the front)",
        columns=[
            Column("rank", "#", numeric=True),
            Column("front", ""),
            Column("quant", "quant"),
            Column("threads", "thr", "int"),
            Column("n_ubatch", "ubatch", "int"),
            Column("kv", "kv"),
            Column("n_gpu_layers", "ngl", "int"),
            Column("bytes", "memory", "mib"),
            Column("gen", "gen tok/s", numeric=True),
            Column("prompt", "prompt tok/s", numeric=True),
            Column("kld", "KLD", "f4"),
            Column("command", "command"),
        ],
        rows=_rows(fits),
        note="\n".join(notes),
        whole=True,
    )
    return Report(
        title="Settings ranked by predicted speed (instr plan)",
        subtitle=(
            f"settings holding {result.n_ctx} tokens of context in {mem}: {len(fits)} of "
            f"{len(ranked)} fit; speeds are predictions (tokens/s, interval) for the first log's "
            "prompt and generation, * = on the Pareto front of memory, speed and (KLD) quality "
            "where measured"
        ),
        warnings=busy_logs([c.prediction for c in ranked]),
        sections=[Section(title="Settings", tables=[table])],
        data=result.to_json(),
    )


def sampling_lines(at: dict[str, Any]) -> list[str]:
    """The logs' sampling, on top of every setting's decode (the speeds above are the decode's),
    and what would pay."""
    top = ", ".join(f"{k} {v:.3f}" for k, v in list(at["samplers_ms_per_token"].items())[:3])
    return [
        f"sampling as measured: {at['sampling_ms_per_token']:.3f} ms a token on top of each "
        f"setting's decode ({at['sampling_share_of_step'] * 100:.0f} % of the logs' generation "
        f"step)" + (f"; costliest: {top}" if top else ""),
        *at["advice"],
    ]


def _rows(fits: list[Candidate]) -> list[dict[str, Any]]:
    rows = []
    rank = 0
    for c in fits:
        # a rank for the covered settings only (plan.rank's first group): "-" for the others
        covered = c.gen is not None
        rank += covered
        rows.append(
            {
                "rank": str(rank) if covered else "-",
                "front": "*" if c.front else "",
                "quant": c.quant,
                "threads": c.threads,
                "n_ubatch": c.n_ubatch,
                "kv": f"{c.type_k} fa {context_choices.flash_attn_name(c.flash_attn)}",
                "n_gpu_layers": c.n_gpu_layers,
                "bytes": c.bytes,
                "gen": rate(c.gen, c.prediction, "gen"),
                "prompt": rate(c.prompt, c.prediction, "prompt"),
                "kld": c.kld,
                "command": " ".join(c.run_args()),
            }
        )
    return rows


def rate(v: float | None, p: Prediction | None, kind: str, spec: str = ".1f") -> str:
    """A predicted rate with its interval at the value's decimals: 3.9 (3.7-4.1), not 3.9
    (4-4); "-" where none was predicted."""
    iv = (p.gen if kind == "gen" else p.prompt) if p else None
    if v is None or iv is None:
        return "-"
    low, value, high = (format(x, spec) for x in (iv.low, v, iv.high))
    return f"{value} ({low}-{high})"


def busy_logs(predictions: Iterable[Prediction | None]) -> list[str]:
    """The logs from a busy machine (``predict.Prediction.contended``: the same for every
    setting), once each."""
    busy = {x: None for p in predictions if p for x in p.contended}
    return [f"a log from a busy machine: {x}" for x in busy]


def not_covered(fits: Iterable[Any]) -> list[str]:
    """What no log measured of the settings that fit, once each, without the run to make."""
    return sorted(
        {line.split("; ")[0] for c in fits if c.prediction for line in c.prediction.not_covered}
    )


def speculation_line(doc: dict[str, Any]) -> str:
    """The settings' speculation: the fastest draft length at the logs' threads."""
    best = doc["by_n_max"][doc["best_n_max"]]
    plain = doc["by_n_max"][0]["gen_tokens_per_s"]
    threads = ", ".join(map(str, doc["threads"]))
    what = (
        f"--spec-draft-n-max {best['n_max']}: {best['gen_tokens_per_s']:.1f} tokens/s predicted"
        if best["n_max"]
        else "none: the drafts cost more than they save"
    )
    return (
        f"speculation at {threads} thread(s), drafting with {doc['draft']} "
        f"(from {len(doc['logs'])} llama-server log(s)): the fastest is {what} "
        f"(a plain decode {plain:.1f}; instr predict --spec-draft-n-max N for any other)"
    )
