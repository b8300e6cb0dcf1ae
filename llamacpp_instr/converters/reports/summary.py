"""Summaries of a session (``instr summary``) and its op workload inventory (``instr export --workloads``).

Both are computed from the DataFrames of ``converters.frames`` — the same model as every writer.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from llamacpp_instr.contract.schema import LEVEL_IDS, level_at_least

from ..analysis import spec_split
from ..analysis.frames import SessionFrames
from ..session.attention import flash_attention
from ..session.request_causes import RequestStory
from ..session.requests import RequestShare, all_tokens
from ..session.speculation import SpecTotals
from . import (
    between_steps,
    device_report,
    media_report,
    memory_report,
    requests_report,
    roofline_report,
    spec_report,
    step_charts,
)
from .report import Chart, Column, Fact, Report, Section, Series, Table, rows_of
from .request_share import part_rows, parts_section, request_shares, share_section, step_rows
from .requests_report import request_stories
from .step_charts import timed_steps

# a speculating session's totals, and each request's
Speculation = tuple[SpecTotals, list[SpecTotals]] | None
BY_COLUMNS = {"op": "label", "layer": "layer", "node": "name"}


def _pct(s: pd.Series, q: float) -> float:
    return float(s.quantile(q)) if len(s) else 0.0


def op_times_recorded(f: SessionFrames) -> bool:
    """Does the log time each op? From DETAILED up, by session_start's ``level`` (for a level this
    version does not know, by whether any op was timed)."""
    level = f.info.level
    if level in LEVEL_IDS:
        return level_at_least(level, "detailed")
    return not f.ops.empty


def overview(f: SessionFrames) -> dict[str, Any]:
    """Headline numbers: throughput, step time percentiles, op-time coverage (None when the log's
    level records no per-op times; of the steps recorded with op times when it was sampled).
    A speculating session's figures are its target's: its verify steps are generation, giving the
    tokens they accepted and their own, over their time and the draft's that fed them; the draft's
    steps are in ``speculation`` (``spec_report.overview``)."""
    steps = f.steps
    sp = spec_split.split(f)
    prompt = steps[steps["kind"] == "prompt"] if sp is None else sp.prompt
    gen = steps[steps["kind"] == "gen"] if sp is None else sp.gen
    gen_tokens = int(gen["n_tokens"].sum()) if sp is None else sp.gen_tokens
    gen_ns = int(gen["dur_ns"].sum()) + (0 if sp is None else sp.draft_gen_ns)
    total_dur = int(steps["dur_ns"].sum())
    timed_dur = int(timed_steps(f)["dur_ns"].sum())
    sampling = f.sampling()
    return {
        "session": f.info.sid,
        "model": f.info.title,
        "level": f.info.level,
        "ended": f.info.ended,
        "steps": len(steps),
        "prompt_tokens": int(prompt["n_tokens"].sum()),
        "gen_tokens": gen_tokens,
        "prompt_tok_s": (
            float(prompt["n_tokens"].sum() / (prompt["dur_ns"].sum() / 1e9)) if len(prompt) else 0.0
        ),
        "gen_tok_s": float(gen_tokens / (gen_ns / 1e9)) if len(gen) and gen_ns else 0.0,
        "gen_step_ms_p50": _pct(gen["dur_ns"], 0.5) / 1e6,
        "gen_step_ms_p90": _pct(gen["dur_ns"], 0.9) / 1e6,
        "gen_step_ms_p99": _pct(gen["dur_ns"], 0.99) / 1e6,
        **(
            {f"draft_step_ms_p{q}": _pct(d["dur_ns"], q / 100) / 1e6 for q in (50, 90, 99)}
            if sp is not None and len(d := step_charts.draft_gen(sp))
            else {}
        ),
        "decode_ns": total_dur,
        "op_ns": int(f.ops["dur_ns"].sum()),
        "op_time_coverage": (
            (float(f.ops["dur_ns"].sum() / timed_dur) if timed_dur else 0.0)
            if op_times_recorded(f)
            else None
        ),
        # which steps the per-op figures come from ("" when every step has op times)
        "sampled": sampling.describe(),
        "steps_with_op_times": sampling.timed_steps if op_times_recorded(f) else 0,
        "steps_by_level": sampling.steps_by_level,
        "files": _files(f),
        "flash_attn": flash_attention(f.info).to_json(),
        **({"speculation": spec_report.overview(f, sp)} if sp is not None else {}),
    }


def _files(f: SessionFrames) -> str:
    """A rotated log read as one: how many files, and whether its first files were rotated away
    ("" for a log of one file)."""
    i = f.info
    if i.files <= 1 and i.first_file == 0:
        return ""
    where = (
        f", from file {i.first_file} of the session (the earlier ones were rotated away)"
        if i.first_file
        else ""
    )
    return f"{i.files} read as one{where}"


def by(f: SessionFrames, key: str, top: int | None = None) -> pd.DataFrame:
    """Time per op type, layer or node: count, total, mean, p50, p95, share, GFLOP/s, GB/s."""
    col = BY_COLUMNS[key]
    ops = f.ops
    if ops.empty:
        return pd.DataFrame(
            columns=[
                key,
                "count",
                "total_ms",
                "mean_us",
                "p50_us",
                "p95_us",
                "share",
                "gflop_s",
                "gb_s",
            ]
        )
    g = ops.groupby(col, observed=True, dropna=False)
    total = float(ops["dur_ns"].sum())
    out = pd.DataFrame(
        {
            "count": g["dur_ns"].size(),
            "total_ms": g["dur_ns"].sum() / 1e6,
            "mean_us": g["dur_ns"].mean() / 1e3,
            "p50_us": g["dur_ns"].quantile(0.5) / 1e3,
            "p95_us": g["dur_ns"].quantile(0.95) / 1e3,
            "share": g["dur_ns"].sum() / total,
            "gflop_s": g["est_flops"].sum() / g["dur_ns"].sum(),
            "gb_s": g["est_bytes"].sum() / g["dur_ns"].sum(),
        }
    )
    if key == "layer":
        slowest = ops.loc[ops.groupby("layer", observed=True)["dur_ns"].idxmax(), ["layer", "name"]]
        out["slowest_op"] = slowest.set_index("layer")["name"].astype(str)
        out = out.sort_index()
    else:
        out = out.sort_values("total_ms", ascending=False)
    out = out.reset_index().rename(columns={col: key})
    # ops outside any layer (and nodes without a name) group under "none"
    out[key] = [
        "none" if pd.isna(v) or str(v) in ("<NA>", "nan") else str(v) for v in out[key].tolist()
    ]
    return out.head(top) if top else out


BY_TITLES = {"op": "op type", "layer": "layer", "node": "graph node"}


def _by_table(f: SessionFrames, key: str, top: int | None) -> Table:
    df = by(f, key)
    cols = [
        Column(key, BY_TITLES[key], "text"),
        Column("count", "count", "int"),
        Column("total_ms", "total (ms)", "f2"),
        Column("mean_us", "mean (µs)", "f2"),
        Column("p50_us", "p50 (µs)", "f2"),
        Column("p95_us", "p95 (µs)", "f2"),
        Column("share", "share of op time", "pct"),
        Column("gflop_s", "GFLOP/s", "f2"),
        Column("gb_s", "GB/s", "f2"),
    ]
    if key == "layer":
        cols.append(Column("slowest_op", "slowest op", "text"))
    sampled = f.sampling().describe()
    return Table(
        name=f"by_{key}",
        title=f"Time per {BY_TITLES[key]}, "
        + (f"the steps with op times: {sampled}" if sampled else "all steps"),
        columns=cols,
        rows=rows_of(df.to_dict(orient="records"), [c.key for c in cols]),
        top=top,
        note="GFLOP/s and GB/s: estimated FLOPs and bytes moved (converters/derive.py) over "
        "measured time.",
    )


def request_latency(f: SessionFrames) -> dict[str, Any] | None:
    """Served requests (instr serve, llama-server): count, what became of them, and latency
    percentiles in ms of those that completed (ok), or None."""
    r = f.requests
    if r is None or r.empty:
        return None
    outcomes = r["outcome"].astype(str) if "outcome" in r else pd.Series(["ok"] * len(r))
    out: dict[str, Any] = {
        "requests": len(r),
        "by_endpoint": r["endpoint"].astype(str).value_counts().to_dict(),
        "outcomes": {k: int((outcomes == k).sum()) for k in ("ok", "error", "cancelled")},
    }
    r = r[outcomes.to_numpy() == "ok"]
    for col, name in (("wait_ns", "wait"), ("ttft_ns", "ttft"), ("dur_ns", "total")):
        v = r[col].dropna().astype("int64") / 1e6
        out[name] = {
            "p50": _pct(v, 0.5),
            "p90": _pct(v, 0.9),
            "p99": _pct(v, 0.99),
            "max": float(v.max()) if len(v) else 0.0,
        }
    # every task's (several prompts, or n_cmpl completions of one, are one request's tasks)
    ok = set(r["id"].astype(str))
    recs = [x for x in f.info.requests if str(x.get("id")) in ok]
    out["gen_tokens"] = int(r["gen_tokens"].sum()) + sum(
        all_tokens(x)[1] - int(x.get("gen_tokens") or 0) for x in recs
    )
    return out


def _requests_section(lat: dict[str, Any], f: SessionFrames) -> Section:
    rows = [
        {"what": label, **lat[key]}
        for key, label in (
            ("wait", "waiting for the model"),
            ("ttft", "time to first token"),
            ("total", "total"),
        )
    ]
    r = f.requests.sort_values("t_arrive")
    return Section(
        "Requests" if lat["outcomes"]["ok"] == lat["requests"] else "Requests (latency: those ok)",
        facts=[
            Fact("requests", lat["requests"], "int"),
            *[
                Fact(f"requests {k}", n, "int")
                for k, n in lat["outcomes"].items()
                if n and (k != "ok" or n != lat["requests"])
            ],
            Fact("generated tokens", lat["gen_tokens"], "int"),
            *[Fact(f"requests to {k}", v, "int") for k, v in lat["by_endpoint"].items()],
        ],
        charts=[
            Chart(
                name="request_latency",
                kind="bars",
                title="Each request: waiting for the model, then time to first token, then the rest",
                x_label="time since the request arrived (ms)",
                y_label="request",
                categories=[str(x) for x in r["id"]],
                series=[
                    Series("wait", (r["wait_ns"].fillna(0) / 1e6).tolist()),
                    Series("time to first token", (r["ttft_ns"].fillna(0) / 1e6).tolist()),
                    Series("total", (r["dur_ns"].fillna(0) / 1e6).tolist()),
                ],
                value_fmt="f1",
            )
        ],
        tables=[
            Table(
                "request_latency",
                "Request latency (ms)",
                [
                    Column("what", "latency"),
                    Column("p50", "p50", "f2"),
                    Column("p90", "p90", "f2"),
                    Column("p99", "p99", "f2"),
                    Column("max", "max", "f2"),
                ],
                rows,
            )
        ],
    )


def _headline_facts(f: SessionFrames, ov: dict[str, Any]) -> list[Fact]:
    """The summary's first lines: the model, the setting, tokens/s and step percentiles (the
    draft's apart), what was sampled and how much of a step the timed ops cover."""
    return [
        Fact("model", ov["model"]),
        Fact("level", ov["level"] or "unknown"),
        Fact("flash attention", flash_attention(f.info).line()),
        Fact("steps", ov["steps"], "int"),
        Fact("prompt tokens", ov["prompt_tokens"], "int"),
        Fact("prompt tokens/s", ov["prompt_tok_s"], "f1"),
        Fact("generated tokens", ov["gen_tokens"], "int"),
        Fact("generation tokens/s", ov["gen_tok_s"], "f1"),
        Fact("generation step p50 (ms)", ov["gen_step_ms_p50"], "f2"),
        Fact("generation step p90 (ms)", ov["gen_step_ms_p90"], "f2"),
        Fact("generation step p99 (ms)", ov["gen_step_ms_p99"], "f2"),
        *(
            [
                Fact(f"the draft's generation step p{q} (ms)", ov[f"draft_step_ms_p{q}"], "f2")
                for q in (50, 90, 99)
            ]
            if "draft_step_ms_p50" in ov
            else []
        ),
        *(
            [Fact("sampled", ov["sampled"] + "; per-op figures are from those steps")]
            if ov["sampled"]
            else []
        ),
        *([Fact("log files", ov["files"])] if ov["files"] else []),
        (
            Fact("op-time coverage (timed ops / step time)", ov["op_time_coverage"], "pct")
            if ov["op_time_coverage"] is not None
            else Fact("op-time coverage", f"not recorded at level {ov['level'] or 'unknown'}")
        ),
    ]


def _facts(
    f: SessionFrames, ov: dict[str, Any], spec_price: spec_split.ModelPrice | None
) -> tuple[list[Fact], Speculation]:
    """The headline facts, a busy machine's verdict first and a speculating session's draft's
    figures after the target's (``ov`` gains the verdict), and the speculation's totals."""
    facts = _headline_facts(f, ov)
    from ..analysis.contention import verdict  # a log from a busy machine: say what it is worth

    ov["busy_machine"] = (busy := verdict(f.steps)).to_json()  # in json's overview
    if busy.flagged:
        facts.insert(0, Fact("busy machine", busy.line()))
    spec = spec_split.totals(f, spec_price) if "speculation" in ov else None
    if "speculation" in ov:  # the target's figures above; the draft's and the verdict here
        at = next(i for i, x in enumerate(facts) if x.label == "generation tokens/s") + 1
        facts[at:at] = spec_report.facts(ov["speculation"], spec[0] if spec else None)
    return facts, spec


def _request_sections(
    f: SessionFrames, lat: dict[str, Any] | None, spec: Speculation, top: int | None
) -> tuple[list[Section], list[RequestShare], list[RequestStory]]:
    """The requests' sections (latency, speculation, shared batches, why some were slow) and the
    shares and stories they show."""
    sections = []
    if lat is not None:
        sections.append(_requests_section(lat, f))
    if spec is not None:
        sections.append(spec_report.section(f, spec))
    rows = step_rows(f) if f.info.requests else []  # the steps, read once for both sections
    shares = request_shares(f, rows)  # llama-server: requests sharing batches
    if shares:
        sections.append(share_section(shares))
    slow = request_stories(f, rows) if lat is not None else []  # why requests were slow
    if slow:
        by_id = {r.id: r for r in spec[1]} if spec else None
        top_samplers = requests_report.costliest_samplers(f)
        sections.append(requests_report.section(slow, top, by_id, top_samplers))
    return sections, shares, slow


def _memory_sections(f: SessionFrames) -> tuple[list[Section], dict[str, Any]]:
    """Where every byte lives, and a MoE's experts' buffers: the sections and their data."""
    memory, memory_data = memory_report.section(f)
    experts, experts_data = memory_report.experts_section(f)
    sections = [x for x in (memory, experts) if x is not None]
    return sections, {**memory_data, **experts_data}


def summary_report(
    f: SessionFrames,
    key: str = "op",
    top: int | None = None,
    spec_price: spec_split.ModelPrice | None = None,
) -> Report:
    """``instr summary``: headline numbers, time per op type / layer / node, and for HTML where a
    generation step's time goes. ``spec_price``: what prices a plain token of a speculating
    session whose log has no single-token target step (the CLI's: predict's model)."""
    ov = overview(f)
    facts, spec = _facts(f, ov, spec_price)
    sections = []
    recorded = ov["op_time_coverage"] is not None
    charts = step_charts.time_charts(f, per_op=recorded)
    if charts:
        sections.append(Section("Where a token's time goes", charts=charts))
    between = between_steps.between_steps(f)  # decode, sampling and the host's work between steps
    if between is not None:
        sections.append(between_steps.section(between))
    devices, devices_data = device_report.section(f)  # a run on several devices
    if devices is not None:
        facts += devices.facts[:1]  # what dominates a token
        sections.append(devices)
    lat = request_latency(f)
    requests, shares, slow = _request_sections(f, lat, spec, top)
    sections += requests
    parts = part_rows(f)  # llama-bench: its tests
    if parts:
        sections.append(parts_section(parts))
    media, media_data = media_report.media_section(f, top)  # images and sounds: each one's time
    if media is not None:
        sections.append(media)
    table = _by_table(f, key, top) if recorded and key in BY_COLUMNS else None
    if table is not None:
        sections.append(Section(f"Time per {BY_TITLES[key]}", tables=[table]))
    csv_table, no_csv = _csv_table(key, table, media, ov["level"])
    memory, memory_data = _memory_sections(f)
    sections += memory
    roof, roof_data = roofline_report.section(f, top)
    if roof is not None:
        facts += roof.facts[:1]  # the headline: decode against the bandwidth
        sections.append(roof)
    elif recorded and f.info.machine:  # a log that names its machine, not yet measured
        facts.append(Fact("roofline", roof_data["note"]))
    return Report(
        title=f"Session {ov['session']}",
        subtitle=f"{ov['model']} · level {ov['level']}"
        + ("" if ov["ended"] else " · NOT ENDED (the log stops mid-session)"),
        facts=facts,
        sections=sections,
        data={
            "overview": ov,
            **({f"by_{key}": table.rows if table is not None else []} if key != "media" else {}),
            **({"requests": lat} if lat is not None else {}),
            **({"between_steps": between.row()} if between is not None else {}),
            **({"request_share": [x.row() for x in shares]} if shares else {}),
            **({"request_causes": [x.row() for x in slow]} if slow else {}),
            **({"parts": parts} if parts else {}),
            **({"speculation": [x.row() for x in spec[1]]} if spec else {}),
            "roofline": roof_data,
            **devices_data,
            **memory_data,
            **media_data,
        },
        csv_table=csv_table,
        no_csv=no_csv,
    )


def _csv_table(key: str, table: Table | None, media: Section | None, level: str) -> tuple[str, str]:
    """The table csv writes (``by_KEY``; ``--by media``: each medium's time), or why none."""
    if key == "media":
        if media is None:
            return "", "no images or sounds in this log: nothing for csv"
        return "media_time", ""
    if table is None:
        return "", f"no per-op times in this log (level {level}): nothing for csv"
    return f"by_{key}", ""


def workloads(f: SessionFrames) -> list[dict[str, Any]]:
    """One record per unique (op, input shapes and types): the kernels this model runs, by time."""
    nodes = f.nodes.set_index(["graph", "node"])
    inputs: dict[tuple[int, int], str] = {}
    key_of: dict[tuple[int, int], str] = {}
    # input shapes and types come from the graph tables of the session model
    for g in {int(x) for x in f.ops["graph"].unique()}:
        for n in f.graphs[g].nodes:
            srcs = []
            for s in n.src:
                if "node" in s:
                    sn = nodes.loc[(g, s["node"])]
                    srcs.append((str(sn["shape"]), str(sn["dtype"])))
                else:
                    srcs.append(("x".join(map(str, s["shape"])), s["type"]))
            inputs[(g, n.i)] = json.dumps(srcs)
            key_of[(g, n.i)] = n.label
    ops = f.ops
    # the key depends on the op's node only: find each (graph, node)'s first op, then each key's
    g_col = ops["graph"].to_numpy(np.int64)
    n_col = ops["node"].to_numpy(np.int64)
    shape, dtype = ops["shape"], ops["dtype"]
    flops = ops["est_flops"].to_numpy()
    _, first, inv = np.unique((g_col << 32) | n_col, return_index=True, return_inverse=True)
    wid = np.empty(len(first), np.int64)  # per (graph, node): its workload, by first appearance
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for u in np.argsort(first, kind="stable").tolist():
        at = int(first[u])
        gn = (int(g_col[at]), int(n_col[at]))
        k = (key_of[gn], inputs[gn], str(shape.iat[at]), str(dtype.iat[at]))
        row = rows.get(k)
        if row is None:
            srcs = json.loads(k[1])
            row = rows[k] = {
                "op": k[0],
                "inputs": [
                    {"shape": [int(d) for d in s.split("x") if d], "type": t} for s, t in srcs
                ],
                "output": {"shape": [int(d) for d in k[2].split("x") if d], "type": k[3]},
                "count": 0,
                "total_ns": 0,
                "est_flops": int(flops[at]),
                "_id": len(rows),
            }
            if k[0].startswith("MUL_MAT") and len(srcs) >= 2:
                a = row["inputs"][0]["shape"]
                b = row["inputs"][1]["shape"]
                row["axes"] = {
                    "K": a[0],
                    "M": a[1] if len(a) > 1 else 1,
                    "N": b[1] if len(b) > 1 else 1,
                }
                row["weight_type"] = srcs[0][1]
        wid[u] = row["_id"]
    of_op = wid[inv.ravel()]
    counts = np.bincount(of_op, minlength=len(rows))
    totals = np.bincount(of_op, weights=ops["dur_ns"].to_numpy(np.float64), minlength=len(rows))
    for row in rows.values():
        i = row.pop("_id")
        row["count"] = int(counts[i])
        row["total_ns"] = int(totals[i])  # sums of ns, exact in a double below 104 days
    out = sorted(rows.values(), key=lambda x: -x["total_ns"])
    for row in out:
        row["mean_ns"] = row["total_ns"] / row["count"]
    return out
