"""The summary's per-step charts (HTML): where a generation step's time goes, layer by layer and
op by op (a typical step, and the mean over the steps), step times and speed over the run. A
speculating session's target's steps (its verify steps and single tokens) and its draft's are
drawn apart, each chart named for whose steps it shows (``analysis.spec_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from llamacpp_instr.contract.schema import LEVEL_IDS, level_at_least

from ..analysis import spec_split
from ..analysis.frames import SessionFrames
from .report import Chart, Series


def timed_steps(f: SessionFrames) -> pd.DataFrame:
    """The steps recorded with op times (at detailed or above): all of them, unless the log was
    sampled (or its level changed while it ran)."""
    if "level" not in f.steps or not f.sampling().mixed:
        return f.steps
    levels = f.steps["level"].astype(str)
    return f.steps[
        levels.map(lambda lv: level_at_least(lv, "detailed") if lv in LEVEL_IDS else True)
    ]


def _typical_gen_step(f: SessionFrames, ids: pd.Series | None = None) -> int | None:
    """The generation step whose duration is the median one (ties: the earliest), among those
    with op times (of the steps ``ids``: a speculating session's target's or draft's)."""
    steps = timed_steps(f)
    gen = steps[steps["step"].isin(ids) if ids is not None else steps["kind"] == "gen"]
    gen = gen.sort_values(["dur_ns", "step"])
    if gen.empty:
        return None
    return int(gen.iloc[(len(gen) - 1) // 2]["step"])


def _gen_steps(f: SessionFrames) -> list[tuple[str, str, pd.DataFrame]]:
    """The generation steps each per-step view is drawn for: (chart name prefix, whose they are
    in the titles, the steps). A speculating session's target's (its verify steps and single
    tokens: ``spec_split``), then its draft's beside them; else every generation step."""
    sp = spec_split.split(f)
    if sp is None:
        return [("", "", f.steps[f.steps["kind"] == "gen"])]
    out = [("", " of the target", sp.gen)]
    if len(draft_gen(sp)):
        out.append(("draft_", " of the draft", draft_gen(sp)))
    return out


def draft_gen(sp: spec_split.Split) -> pd.DataFrame:
    """A speculating session's draft's generation steps: its single tokens (drafting), not its
    prompts or the batches it takes a verify's tokens in with."""
    return sp.draft[sp.draft["n_tokens"] == 1]


def _layer_name(layer: Any) -> str:
    return "outside layers" if pd.isna(layer) or int(layer) < 0 else f"layer {int(layer)}"


def _per_value(col: pd.Series, fn: Callable[[Any], str]) -> pd.Series:
    """``col.map(fn)``, calling ``fn`` once per distinct value (a million ops have a few dozen)."""
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    names = np.array([fn(u) for u in uniques], dtype=object)
    return pd.Series(names[codes], index=col.index)


def time_charts(f: SessionFrames, per_op: bool = True) -> list[Chart]:
    """Where a token's time goes: per layer by op type (typical step, and all steps; only with
    ``per_op``, when the log's level times ops), step times and speed; a speculating session's
    target's, then its draft's, each named (``_gen_steps``)."""
    charts: list[Chart] = []
    for prefix, whose, steps in _gen_steps(f):
        charts += _step_charts(f, per_op, prefix, whose, steps)
    return charts


def _step_charts(
    f: SessionFrames, per_op: bool, prefix: str, whose: str, gen: pd.DataFrame
) -> list[Chart]:
    """``time_charts`` of the generation steps ``gen``, the charts' names prefixed with
    ``prefix`` and their titles saying ``whose`` steps they are."""
    charts: list[Chart] = []
    ops = f.ops if per_op else f.ops.iloc[0:0]
    gen_ops = ops[ops["step"].isin(gen["step"])]
    if gen_ops.empty and not prefix:
        gen_ops = ops
    if not gen_ops.empty:
        charts += _op_charts(f, gen_ops, prefix, whose, gen)
    gen = gen.sort_values("step")
    if len(gen) >= 2:
        charts += [_step_time_histogram(gen, prefix, whose), _speed_chart(gen, prefix, whose)]
    return charts


def _op_charts(
    f: SessionFrames, gen_ops: pd.DataFrame, prefix: str, whose: str, gen: pd.DataFrame
) -> list[Chart]:
    """The time of the ops ``gen_ops`` per layer (``l``) and op type (``k``): in a typical step
    of ``gen``, and the mean per step."""
    # the op types that hold most of the time, the rest as "other"
    totals = gen_ops.groupby("label", observed=True)["dur_ns"].sum().sort_values()[::-1]
    kinds = [str(k) for k in totals.index[:8]]
    label = _per_value(gen_ops["label"], lambda v: str(v) if str(v) in kinds else "other")
    if (label == "other").any():
        kinds.append("other")
    layer_key = _per_value(gen_ops["layer"], _layer_name)
    order = sorted(
        layer_key.unique(),
        key=lambda s: (
            s == "outside layers",
            int(s.split()[-1]) if s != "outside layers" else 0,
        ),
    )
    keyed = gen_ops.assign(k=label, l=layer_key)
    charts = []
    step = _typical_gen_step(f, gen["step"] if whose else None)
    if step is not None:
        charts.append(_typical_step_chart(keyed, step, kinds, order, prefix, whose))
    charts.append(_layer_op_heatmap(keyed, kinds, order, prefix, whose))
    return charts


def _typical_step_chart(
    keyed: pd.DataFrame, step: int, kinds: list[str], order: list[str], prefix: str, whose: str
) -> Chart:
    """The time per layer by op type of one step, ``step`` (``_op_charts``' ``keyed`` ops)."""
    t = keyed[keyed["step"] == step].groupby(["l", "k"])["dur_ns"].sum() / 1e3
    return Chart(
        name=f"{prefix}typical_step_by_layer",
        kind="stacked",
        title=f"A typical generation step{whose} (step {step}, the median "
        "duration): time per layer by op type",
        x_label="time in the step (µs)",
        y_label="layer",
        categories=order,
        series=[Series(k, [float(t.get((lay, k), 0.0)) for lay in order]) for k in kinds],
        value_fmt="f1",
    )


def _layer_op_heatmap(
    keyed: pd.DataFrame, kinds: list[str], order: list[str], prefix: str, whose: str
) -> Chart:
    """The mean time per step of each transformer layer and op type (``_op_charts``' ``keyed``
    ops): the output projection outside the layers would wash out the scale."""
    n_gen = max(1, keyed["step"].nunique())
    mean = keyed.groupby(["l", "k"])["dur_ns"].sum() / n_gen / 1e3
    in_layers = [lay for lay in order if lay != "outside layers"] or order
    return Chart(
        name=f"{prefix}layer_op_heatmap",
        kind="heatmap",
        title=f"Time per transformer layer and op type, mean per generation step{whose}",
        x_label="columns: op type",
        y_label="layer",
        categories=in_layers,
        columns=kinds,
        matrix=[[float(mean.get((lay, k), 0.0)) for k in kinds] for lay in in_layers],
        value_fmt="f1",
        note="Values in µs per step; hover a cell for its value. Ops outside the layers "
        "(embedding, final norm, output projection) are in the chart above.",
    )


def _step_time_histogram(gen: pd.DataFrame, prefix: str, whose: str) -> Chart:
    """The generation steps ``gen`` (two or more) by duration, in 5 to 24 bins."""
    ms = (gen["dur_ns"] / 1e6).to_numpy()
    lo, hi = float(ms.min()), float(ms.max())
    n_bins = int(min(24, max(5, len(ms) // 3)))
    width = (hi - lo) / n_bins or 1.0
    counts = [0] * n_bins
    for v in ms:
        counts[min(n_bins - 1, int((v - lo) / width))] += 1
    return Chart(
        name=f"{prefix}step_time_histogram",
        kind="histogram",
        title=f"Generation step times{whose}",
        x_label="llama_decode time per generation step (ms)",
        y_label="steps",
        categories=[f"{lo + i * width:.2f}" for i in range(n_bins)],
        series=[Series("steps", [float(c) for c in counts])],
        value_fmt="int",
        note=f"{n_bins} bins of {width:.3f} ms from {lo:.2f} ms; labels are bin starts.",
    )


def _speed_chart(gen: pd.DataFrame, prefix: str, whose: str) -> Chart:
    """Tokens/s of each generation step of ``gen``, in step order."""
    return Chart(
        name=f"{prefix}tokens_per_second",
        kind="line",
        title=f"Generation speed over the run{whose}",
        x_label="decode step",
        y_label="tokens/s",
        x=[float(s) for s in gen["step"]],
        series=[Series("tokens/s", (gen["n_tokens"] / (gen["dur_ns"] / 1e9)).tolist())],
        value_fmt="f1",
    )
