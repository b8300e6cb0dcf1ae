"""Summaries of a session (``instr summary``) and its op workload inventory (``instr workloads``).

Both are computed from the DataFrames of ``converters.frames`` — the same model as every writer.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .frames import SessionFrames
from .schema import LEVEL_IDS, level_at_least

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
    level records no per-op times)."""
    steps = f.steps
    prompt = steps[steps["kind"] == "prompt"]
    gen = steps[steps["kind"] == "gen"]
    total_dur = int(steps["dur_ns"].sum())
    return {
        "session": f.info.sid,
        "model": f.info.title,
        "level": f.info.level,
        "ended": f.info.ended,
        "steps": len(steps),
        "prompt_tokens": int(prompt["n_tokens"].sum()),
        "gen_tokens": int(gen["n_tokens"].sum()),
        "prompt_tok_s": (
            float(prompt["n_tokens"].sum() / (prompt["dur_ns"].sum() / 1e9)) if len(prompt) else 0.0
        ),
        "gen_tok_s": (
            float(gen["n_tokens"].sum() / (gen["dur_ns"].sum() / 1e9)) if len(gen) else 0.0
        ),
        "gen_step_ms_p50": _pct(gen["dur_ns"], 0.5) / 1e6,
        "gen_step_ms_p90": _pct(gen["dur_ns"], 0.9) / 1e6,
        "gen_step_ms_p99": _pct(gen["dur_ns"], 0.99) / 1e6,
        "decode_ns": total_dur,
        "op_ns": int(f.ops["dur_ns"].sum()),
        "op_time_coverage": (
            (float(f.ops["dur_ns"].sum() / total_dur) if total_dur else 0.0)
            if op_times_recorded(f)
            else None
        ),
    }


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
    out[key] = out[key].astype(str).replace({"<NA>": "none", "nan": "none"})
    return out.head(top) if top else out


def render(f: SessionFrames, key: str, top: int | None, fmt: str) -> str:
    ov = overview(f)
    table = by(f, key, top)
    if fmt == "json":
        return json.dumps({"overview": ov, f"by_{key}": table.to_dict(orient="records")}, indent=2)
    if fmt == "csv":
        return table.to_csv(index=False)
    head = [
        f"session {ov['session']}  {ov['model']}  level {ov['level']}"
        + ("" if ov["ended"] else "  (NOT ENDED)"),
        f"steps {ov['steps']}: {ov['prompt_tokens']} prompt tokens at {ov['prompt_tok_s']:.1f} tok/s, "
        f"{ov['gen_tokens']} generated at {ov['gen_tok_s']:.1f} tok/s",
        f"generation step time: p50 {ov['gen_step_ms_p50']:.2f} ms, p90 {ov['gen_step_ms_p90']:.2f} ms, "
        f"p99 {ov['gen_step_ms_p99']:.2f} ms",
        (
            f"op-time coverage: {ov['op_time_coverage']:.1%} of llama_decode time is in timed ops"
            if ov["op_time_coverage"] is not None
            else f"op-time coverage: not recorded at level {ov['level'] or 'unknown'}"
        ),
    ]
    if ov["op_time_coverage"] is None:  # no op table to show
        return "\n".join([f"- {h}" for h in head] if fmt == "markdown" else head)
    fmt_table = table.copy()
    fmt_table["share"] = (fmt_table["share"] * 100).map("{:.1f}%".format)
    for c in ("total_ms", "mean_us", "p50_us", "p95_us", "gflop_s", "gb_s"):
        fmt_table[c] = fmt_table[c].map("{:.2f}".format)
    if fmt == "markdown":
        cols = list(fmt_table.columns)
        rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        rows += [
            "| " + " | ".join(str(v) for v in r) + " |" for r in fmt_table.itertuples(index=False)
        ]
        return "\n".join([f"- {h}" for h in head] + ["", *rows])
    return "\n".join(head + ["", fmt_table.to_string(index=False, max_colwidth=40)])


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
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in f.ops[["graph", "node", "dur_ns", "shape", "dtype", "est_flops"]].itertuples(
        index=False
    ):
        k = (key_of[(r.graph, r.node)], inputs[(r.graph, r.node)], str(r.shape), str(r.dtype))
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
                "est_flops": int(r.est_flops),
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
        row["count"] += 1
        row["total_ns"] += int(r.dur_ns)
    out = sorted(rows.values(), key=lambda x: -x["total_ns"])
    for row in out:
        row["mean_ns"] = row["total_ns"] / row["count"]
    return out
