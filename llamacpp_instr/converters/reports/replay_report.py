"""``instr replay``'s report: the recording and each replayed setting in one table (percentiles of
TTFT, TPOT, ITL and end to end, throughput, goodput, peak memory per device), the latency CDFs of
each, the line naming the best setting, and every replayed request against its recording."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..session.replay_figures import LATENCIES, PERCENTILES, RECORDED, Setting, Slo, cdf
from . import replay_stalls
from .report import Chart, Column, Fact, Report, Section, Series, Table

# the points of a CDF chart's latency axis
CDF_POINTS = 48
_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "e2e"}
REQUEST_COLUMNS = [
    Column("setting", "setting"),
    Column("id", "recorded id"),
    Column("endpoint", "endpoint"),
    Column("status", "status", "int"),
    Column("n_out", "tokens out", "int"),
    Column("ttft_ms", "TTFT (ms)", "f1"),
    Column("recorded_ttft_ms", "recorded TTFT (ms)", "f1"),
    Column("tpot_ms", "TPOT (ms)", "f2"),
    Column("itl_max_ms", "worst ITL (ms)", "f1"),
    Column("e2e_ms", "e2e (ms)", "f1"),
    Column("recorded_e2e_ms", "recorded e2e (ms)", "f1"),
    Column("server_ttft_ms", "server TTFT (ms)", "f1"),
    Column("server_dur_ms", "server e2e (ms)", "f1"),
    Column("prompt_ms", "prompt (ms)", "f1"),
    Column("predicted_ms", "generation (ms)", "f1"),
    Column("cache_reused", "cache reused", "int"),
    Column("recorded_cache_reused", "recorded cache reused", "int"),
    Column("cache_n", "cache_n", "int"),
    Column("identical", "same tokens"),
]


class Replay(Protocol):
    """What a replay gives the report (``running.replay.rerun.ReplayResult``)."""

    log: Path
    speed: float
    slo: Slo | None
    settings: list[Setting]
    summaries: list[dict[str, Any]]
    skipped: Any  # a Counter of why each request was not sent
    session_requests: int
    responses: list[Path]
    stalls: dict[str, list[dict[str, Any]]]  # each run's late tokens (``replay_stalls``)


def _setting_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The summaries flattened into rows, and the devices of their peak memory."""
    devices = sorted({d for s in summaries for d in s["peak_memory"]})
    rows = []
    for s in summaries:
        row = {k: s[k] for k in ("setting", "requests", "failed", "throughput", "goodput")}
        for key in LATENCIES:
            row |= {f"{key}_p{p}": s[key][f"p{p}"] for p in PERCENTILES}
        row |= {f"peak:{d}": s["peak_memory"].get(d) for d in devices}
        rows.append(row)
    return rows, devices


def settings_table(summaries: Sequence[dict[str, Any]]) -> Table:
    rows, devices = _setting_rows(summaries)
    columns = [
        Column("setting", "setting"),
        Column("requests", "requests", "int"),
        Column("failed", "failed", "int"),
    ]
    for key in LATENCIES:
        columns += [
            Column(f"{key}_p{p}", f"{_NAMES[key]} p{p} (ms)", "f1" if key != "tpot_ms" else "f2")
            for p in PERCENTILES
        ]
    columns += [Column("throughput", "tokens/s", "f1"), Column("goodput", "goodput", "pct")]
    columns += [Column(f"peak:{d}", f"peak {d}", "bytes") for d in devices]
    return Table(
        "settings",
        "The recording and each setting",
        columns,
        rows,
        note="Percentiles of the requests that succeeded; tokens/s: their output tokens over the "
        "wall span; goodput: the share of the requests sent that met the SLO; peak: each device's "
        "backend buffers at their peak, from each run's own log.",
        whole=True,
    )


def cdf_chart(settings: Sequence[Setting], key: str) -> Chart | None:
    values = {s.name: [r[key] for r in s.rows if r["ok"] and r[key] is not None] for s in settings}
    top = max((max(v) for v in values.values() if v), default=None)
    if not top:
        return None
    grid = [top * k / (CDF_POINTS - 1) for k in range(CDF_POINTS - 1)] + [top]  # (top itself)
    return Chart(
        name=f"{key[:-3]}_cdf",
        kind="line",
        title=f"{_NAMES[key]}: the share of requests within each latency",
        x_label=f"{_NAMES[key]} (ms)",
        y_label="share of requests",
        x=grid,
        series=[Series(name, cdf(v, grid)) for name, v in values.items() if v],
        value_fmt="pct",
    )


def requests_table(rows: Sequence[dict[str, Any]], times: str | None = None) -> Table:
    """Each replayed request (rows of ``replay_figures.replayed_row``) against its recording;
    ``times``: where its TTFT, gaps and end to end come from, when not from the replay's client."""
    return Table(
        "requests",
        "Each replayed request against its recording",
        REQUEST_COLUMNS,
        list(rows),
        note=(
            times or "TTFT: the client's for a stream, else the server's own (its request record)"
        )
        + "; same tokens: the replay's generated token ids are the recording's (– where a log "
        "lacks them).",
        top=20,
    )


def _facts(r: Replay, verdict: str | None) -> list[Fact]:
    sent = len(r.settings[0].rows)
    facts = [
        Fact("requests replayed", f"{sent:,} of the session's {r.session_requests:,}"),
        Fact("speed", f"{r.speed:g}x"),
    ]
    if r.skipped:
        told = ", ".join(f"{k}: {v}" for k, v in sorted(r.skipped.items()))
        facts.append(Fact("not sent", f"{sum(r.skipped.values()):,} ({told})"))
    if r.slo is not None:
        facts.append(Fact("SLO", r.slo.describe()))
    if verdict:
        facts.append(Fact("verdict", verdict))
    facts += [Fact("responses", str(p)) for p in r.responses]
    return facts


def replay_report(r: Replay, verdict: str | None = None, best: str | None = None) -> Report:
    """The report of a replay; ``verdict``: the line naming the best setting (``best``)."""
    charts = [c for k in ("e2e_ms", "ttft_ms") if (c := cdf_chart(r.settings, k)) is not None]
    replayed = [row for s in r.settings if s.name != RECORDED for row in s.rows]
    requests = requests_table(replayed)
    data = {
        "log": str(r.log),
        "speed": r.speed,
        "slo": None if r.slo is None else {"ttft_ms": r.slo.ttft_ms, "tpot_ms": r.slo.tpot_ms},
        "session_requests": r.session_requests,
        "skipped": dict(r.skipped),
        "settings": r.summaries,
        "best": best,
        "verdict": verdict,
        "requests": replayed,
        "stalls": [row for rows in r.stalls.values() for row in rows],
        "responses": [str(p) for p in r.responses],
    }
    return Report(
        title=f"instr replay: {r.log}",
        facts=_facts(r, verdict),
        sections=[
            Section("Settings", tables=[settings_table(r.summaries)], charts=charts),
            Section("Requests", tables=[requests]),
            *([replay_stalls.section(r.stalls)] if r.stalls else []),
        ],
        data=data,
        csv_table="requests",
    )
