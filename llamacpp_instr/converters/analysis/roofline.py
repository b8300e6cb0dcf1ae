"""Every op against its roof: the roofline model over a session's ops, with measured peaks.

An op that moves ``B`` bytes and does ``F`` FLOPs (``derive.py``'s estimates) cannot take less
than ``ideal = max(B / bandwidth, F / compute)`` on this machine: the roofline. Its arithmetic
intensity is ``F / B`` (FLOPs per byte); it is bound by memory when ``B / bandwidth`` is the larger
term, by compute otherwise. Its fraction of the roof is ``ideal / measured time``, which is the
same as achieved GFLOP/s over the attainable GFLOP/s at its intensity (``min(compute, bandwidth *
intensity)``), and for an op without FLOPs, achieved GB/s over the bandwidth. Summed over ops,
``sum(ideal) / sum(time)`` is the time-weighted fraction, and ``time - ideal`` the time lost
against the roof.

The compute roof of a matmul is the measured peak of its weight's type (a KV cache read: the
cache's type); other ops are set against the F32 matmul peak. Types not measured use the highest
measured peak (``peaks.DevicePeaks.compute_roof``).

Per step, the headline: a generation step reads every weight it uses and the KV cache
(``derive.weight_bytes_read`` + ``derive.kv_bytes_read``) once; those bytes over the step's time,
against the bandwidth, is how close decoding runs to the memory limit. A prompt step is set
against the compute roof: the time its FLOPs need at the roofs over its time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..session import derive
from ..session.machine_peaks import MATMULS, DevicePeaks, Peaks, Roof, kv_type

OP_COLS = ("intensity", "gflops_s", "gbs", "ideal_ns", "roof_frac", "bound")
STEP_COLS = ("weight_bytes", "kv_bytes", "ideal_ns", "roof_frac", "roof")


def compute_roofs(ops: pd.DataFrame, dev: DevicePeaks, kv_type: str) -> np.ndarray:
    """Each op's compute roof (GFLOP/s, ``Roof.compute``), looked up per category, not per op (a
    million ops)."""
    roof = Roof(dev, kv_type)
    op = pd.Categorical(ops["op"])
    wt = pd.Categorical(ops["weight_type"])
    mm_cat = np.isin(np.asarray(op.categories, dtype=object), MATMULS)
    is_mm = np.zeros(len(ops), bool)
    known = op.codes >= 0
    is_mm[known] = mm_cat[op.codes[known]]
    # code -1 (no weight) takes the last entry: the KV cache's type
    lut = np.array(
        [roof.compute(MATMULS[0], str(t)) for t in wt.categories]
        + [roof.compute(MATMULS[0], None)],
        np.float64,
    )
    return np.where(is_mm, lut[wt.codes], roof.compute("", None))


def _div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den as float64, NaN where den is 0 (one pass, no warnings)."""
    out = np.full(len(num), np.nan)
    return np.divide(num, den, out=out, where=den > 0)


def ideal_ns(
    n_bytes: np.ndarray, n_flops: np.ndarray, bandwidth: float, compute: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The least time (ns) at the roofs, whether compute binds it, and the compute term."""
    mem = n_bytes / bandwidth if bandwidth > 0 else np.zeros(len(n_bytes))
    comp = np.divide(n_flops, compute, out=np.zeros(len(n_flops)), where=compute > 0)
    return np.maximum(mem, comp), comp > mem, comp


def op_columns(ops: pd.DataFrame, dev: DevicePeaks | None, kv_type: str) -> dict[str, Any]:
    """The roofline columns of an ops frame (NaN and None where no peaks are known)."""
    b = ops["est_bytes"].to_numpy()
    f = ops["est_flops"].to_numpy()
    d = ops["dur_ns"].to_numpy()
    cols: dict[str, Any] = {"intensity": _div(f, b), "gflops_s": _div(f, d), "gbs": _div(b, d)}
    n = len(ops)
    if dev is None:
        cols["ideal_ns"] = np.full(n, np.nan)
        cols["roof_frac"] = np.full(n, np.nan)
        cols["bound"] = np.full(n, None, dtype=object)  # (an empty categorical fails parquet)
        return cols
    compute = compute_roofs(ops, dev, kv_type)
    ideal, by_compute, comp = ideal_ns(b, f, dev.bandwidth_gbs, compute)
    cols["ideal_ns"] = ideal
    cols["roof_frac"] = _div(ideal, d)
    cols["bound"] = pd.Categorical.from_codes(
        by_compute.view(np.int8), categories=["memory", "compute"]
    )
    cols["compute_ns"] = comp  # the FLOPs at the compute roof (for the prompt steps' headline)
    return cols


def graph_reads(graph: derive.Graph) -> tuple[int, int]:
    """Weight and KV cache bytes one compute of the graph reads."""
    w = sum(derive.weight_bytes_read(n, graph) for n in graph.nodes)
    kv = sum(derive.kv_bytes_read(n, graph) for n in graph.nodes)
    return w, kv


def step_columns(
    steps: pd.DataFrame,
    ops: pd.DataFrame,
    graphs: dict[int, Any],
    dev: DevicePeaks | None,
    compute_ns: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per step: the weight and KV bytes it read, its least time at its roof (generation: the
    bytes at the bandwidth; prompt: each op's FLOPs at its compute roof, ``compute_ns``) and the
    fraction of the roof."""
    n = len(steps)
    reads = {g: graph_reads(graph) for g, graph in graphs.items()}
    w = pd.Series(0, index=steps["step"].to_numpy(), dtype=np.int64)
    kv = w.copy()
    computes = ops[["step", "ubatch", "graph"]].drop_duplicates()
    if len(computes):
        per = [reads.get(int(g), (0, 0)) for g in computes["graph"]]
        by_step = (
            pd.DataFrame(
                {
                    "step": computes["step"].to_numpy(),
                    "w": [r[0] for r in per],
                    "kv": [r[1] for r in per],
                }
            )
            .groupby("step")[["w", "kv"]]
            .sum()
        )
        w = w.add(by_step["w"], fill_value=0).astype(np.int64).loc[w.index]
        kv = kv.add(by_step["kv"], fill_value=0).astype(np.int64).loc[kv.index]
    cols: dict[str, Any] = {"weight_bytes": w.to_numpy(), "kv_bytes": kv.to_numpy()}
    ideal = np.full(n, np.nan)
    roof = np.full(n, None, dtype=object)
    if dev is not None and n:
        is_gen = (steps["kind"].astype(str) == "gen").to_numpy()
        mem = (cols["weight_bytes"] + cols["kv_bytes"]) / dev.bandwidth_gbs
        comp = np.zeros(n)
        if compute_ns is not None and len(ops):
            s = pd.Series(compute_ns).groupby(ops["step"].to_numpy()).sum()
            comp = s.reindex(steps["step"].to_numpy(), fill_value=0.0).to_numpy()
        ideal = np.where(is_gen, mem, comp)
        roof = np.where(is_gen, "memory", "compute").astype(object)
    d = steps["dur_ns"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(d > 0, ideal / d, np.nan)
    cols.update(ideal_ns=ideal, roof_frac=frac, roof=pd.Categorical(roof) if dev else roof)
    return cols


def apply(frames: Any, peaks: Peaks | None, note: str = "") -> None:
    """Add (or replace) the roofline columns of ``frames.ops`` and ``frames.steps`` (and of an
    encoder's ops, ``frames.encode_ops``, where there are any)."""
    dev = peaks.device() if peaks is not None else None
    encode_ops = getattr(frames, "encode_ops", None)
    if encode_ops is not None and len(encode_ops.columns):
        ecols = op_columns(encode_ops, dev, kv_type(frames.info))
        for k in OP_COLS:
            encode_ops[k] = ecols[k]
    ops = frames.ops
    cols = op_columns(ops, dev, kv_type(frames.info))
    for k in OP_COLS:
        ops[k] = cols[k]
    scols = step_columns(frames.steps, ops, frames.graphs, dev, cols.get("compute_ns"))
    for k in STEP_COLS:
        frames.steps[k] = scols[k]
    frames.peaks = peaks
    frames.peaks_note = note


def aggregate(ops: pd.DataFrame, key: str | list[str]) -> pd.DataFrame:
    """Per group (op type, layer, ...), weighted by time: bytes, FLOPs, time, the ideal time at
    the roofs, the time lost against them, intensity, achieved rates and the roof fraction."""
    keys = [key] if isinstance(key, str) else list(key)
    tmp = ops[keys + ["dur_ns", "est_bytes", "est_flops", "ideal_ns"]].copy()
    tmp["compute_ns"] = np.where((ops["bound"] == "compute").to_numpy(), ops["dur_ns"], 0)
    out = tmp.groupby(keys, observed=True, dropna=False).sum(min_count=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["intensity"] = out["est_flops"] / out["est_bytes"].where(out["est_bytes"] > 0)
        dur = out["dur_ns"].where(out["dur_ns"] > 0)
        out["gflops_s"] = out["est_flops"] / dur
        out["gbs"] = out["est_bytes"] / dur
        out["roof_frac"] = out["ideal_ns"] / dur
    out["lost_ns"] = out["dur_ns"] - out["ideal_ns"]
    bound = np.where(out["compute_ns"] * 2 > out["dur_ns"], "compute", "memory").astype(object)
    bound[out["ideal_ns"].isna().to_numpy()] = None
    out["bound"] = bound
    return out.drop(columns="compute_ns").reset_index()


def headline(steps: pd.DataFrame, kind: str) -> dict[str, Any] | None:
    """Steps of one kind (``gen`` or ``prompt``) against their roof, time-weighted: the fraction,
    the bytes read per token, achieved GB/s. None without peaks or steps."""
    s = steps[(steps["kind"].astype(str) == kind) & steps["roof_frac"].notna()]
    if s.empty:
        return None
    dur = float(s["dur_ns"].sum())
    read = float((s["weight_bytes"] + s["kv_bytes"]).sum())
    tokens = float(s["n_tokens"].sum())
    return {
        "kind": kind,
        "roof": "memory" if kind == "gen" else "compute",
        "steps": int(len(s)),
        "fraction": float(s["ideal_ns"].sum()) / dur if dur else float("nan"),
        "bytes_per_token": read / tokens if tokens else float("nan"),
        "weight_bytes_per_token": float(s["weight_bytes"].sum()) / tokens if tokens else 0.0,
        "kv_bytes_per_token": float(s["kv_bytes"].sum()) / tokens if tokens else 0.0,
        "gbs": read / dur if dur else float("nan"),
        "ms_per_token": dur / tokens / 1e6 if tokens else float("nan"),
    }


def sentence(h: dict[str, Any], peaks: Peaks) -> str:
    """The headline in words."""
    dev = peaks.device()
    if h["kind"] == "gen":
        return (
            f"decode runs at {h['fraction'] * 100:.0f} % of this machine's memory bandwidth "
            f"({h['gbs']:.1f} of {dev.bandwidth_gbs:.1f} GB/s: "
            f"{h['bytes_per_token'] / 1e6:.1f} MB read per token)"
        )
    return (
        f"prompt processing runs at {h['fraction'] * 100:.0f} % of this machine's compute roof "
        f"(matmul peaks {', '.join(f'{t} {v:.0f}' for t, v in dev.matmul_gflops.items())} GFLOP/s)"
    )


def losers(ops: pd.DataFrame, key: str = "label", n: int = 3) -> list[dict[str, Any]]:
    """The groups that lose most time against the roof, largest first."""
    if ops.empty or ops["ideal_ns"].isna().all():
        return []
    a = aggregate(ops, key).sort_values("lost_ns", ascending=False)
    total = float(a["lost_ns"].clip(lower=0).sum())
    out = []
    for r in a.head(n).itertuples():
        lost = float(r.lost_ns)
        if lost > 0:
            out.append({key: str(getattr(r, key)), "lost_ns": lost, "share": lost / total})
    return out
