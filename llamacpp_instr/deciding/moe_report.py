"""A mixture of experts' placements, ranked (``moe_plan.PlacementResult``), as a report: each with
its memory per device, its predicted speeds and its command line."""

from __future__ import annotations

from typing import Any

from llamacpp_instr.contract.units import fmt_bytes
from llamacpp_instr.converters.reports.report import Column, Report, Section, Table
from llamacpp_instr.deciding import fit
from llamacpp_instr.deciding.moe_plan import PlacementCandidate, PlacementResult
from llamacpp_instr.deciding.plan_report import busy_logs, not_covered, rate


def report(result: PlacementResult) -> Report:
    ranked, t = result.ranked, result.target
    fits = [c for c in ranked if c.fits]
    mem = ", ".join(f"{d} {fmt_bytes(n, 'MiB')}" for d, n in result.limits.items())
    devs = sorted({d for c in ranked for d in c.footprint})
    rows = []
    n = 0
    for c in ranked:
        covered = c.fits and c.gen is not None
        n += covered
        totals = fit.totals(c.footprint)
        rows.append(
            {
                "rank": str(n) if covered else "-",
                "placement": c.placement.label(),
                "cpu_experts": c.expert_bytes_cpu,
                **{f"device {d}": totals.get(d, 0) for d in devs},
                "gen": _rate(c, "gen"),
                "prompt": _rate(c, "prompt"),
                "command": c.command(t, result.n_ctx)
                + ("" if c.fits else f"  (overflows {', '.join(c.overflow)})"),
            }
        )
    missing = not_covered(fits)
    note = ""
    if missing:
        note = "not covered (unranked: run such a setting at --level detailed, add its log):\n"
        note += "\n".join(f"  {line}" for line in missing)
    table = Table(
        name="placements",
        title="placements, fastest first (memory per device; tokens/s with its interval)",
        columns=[
            Column("rank", "#", numeric=True),
            Column("placement", "experts on the CPU"),
            Column("cpu_experts", "CPU experts", "mib"),
            *[Column(f"device {d}", d, "mib") for d in devs],
            Column("gen", "gen tok/s", numeric=True),
            Column("prompt", "prompt tok/s", numeric=True),
            Column("command", "command"),
        ],
        rows=rows,
        note=note,
        whole=True,
    )
    return Report(
        title=f"Expert placements of {t.model.name} (instr plan --experts)",
        subtitle=(
            f"-ngl {t.offload.gpu_layers}; {len(result.layers)} layers with experts, "
            f"{fmt_bytes(sum(result.layers.values()), 'MiB')} of expert weights; holding "
            f"{result.n_ctx} tokens of context in {mem}: {len(fits)} of {len(ranked)} fit; speeds "
            "are predictions (tokens/s, interval) for the first log's prompt and generation"
        ),
        warnings=busy_logs([c.prediction for c in ranked]),
        sections=[Section(title="Placements", tables=[table])],
        data=result.to_json(),
    )


def _rate(c: PlacementCandidate, kind: str) -> Any:
    v = c.gen if kind == "gen" else c.prompt
    return rate(v, c.prediction, kind, ".2f")
