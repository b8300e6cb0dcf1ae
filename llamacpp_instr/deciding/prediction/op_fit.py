"""The fit behind ``op_costs.CostModel``: each op class's efficiency against the device's roofs
and fixed cost, from the logs' measured ops (see ``op_costs`` for what a class is and how a node
is priced), the roles a device ran only fused, and a self-check of the model on the logs it was
fitted on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from llamacpp_instr.deciding.prediction import kv_costs, net_costs, op_threads, split_costs
from llamacpp_instr.deciding.prediction.expert_traffic import ExpertTraffic
from llamacpp_instr.deciding.prediction.op_costs import (
    FIXED_PERCENTILE,
    ROOF_PERCENTILE,
    ClassKey,
    CostModel,
    Fit,
    GraphCosts,
    Roofs,
    Where,
    first_source,
    role,
)

LogGraphs = dict[int, tuple[GraphCosts, list[str]]]


def log_graphs(frames: Any) -> LogGraphs:
    """Each graph a log's ops ran, by id: what its nodes cost is made of, and each node's device
    (at the graph's first compute), worked out once for the fit and its self-check."""
    out: LogGraphs = {}
    first = frames.ops.drop_duplicates("graph")[["graph", "step", "ubatch"]]
    for gid, step, ub in first.itertuples(index=False):
        g = frames.graphs.get(int(gid))
        if g is not None:
            devices = split_costs.node_devices(frames, int(step), int(ub), len(g.nodes))
            out[int(gid)] = (GraphCosts.of(g), devices)
    return out


def _op_frame(frames: Any, graphs: LogGraphs, where_of: Any) -> pd.DataFrame | None:
    """The timed ops of one session with their class and size, or None without ops."""
    ops = frames.ops
    if ops.empty:
        return None
    kinds = frames.steps.set_index("step")["kind"].astype(str)
    parts = []
    for gid, rows in ops.groupby("graph", sort=False):
        if int(gid) not in graphs:
            continue
        gc = graphs[int(gid)][0]
        idx = rows["node"].to_numpy()
        n_bytes = gc.bytes[idx]
        if "expert_bytes" in rows.columns:
            # an expert matmul whose routing the log holds: the experts its ubatch used
            routed = (rows["expert_bytes"].astype(object) == "routed").to_numpy()
            if routed.any():
                n_bytes = np.where(routed, rows["est_bytes"].to_numpy(np.float64), n_bytes)
        parts.append(
            pd.DataFrame(
                {
                    "graph": int(gid),
                    "node": idx,
                    "step": rows["step"].to_numpy(),
                    "ubatch": rows["ubatch"].to_numpy(),
                    "dur": rows["dur_ns"].to_numpy(np.float64),
                    "label": np.asarray(gc.labels, object)[idx],
                    "type0": np.asarray(gc.types, object)[idx],
                    "role": np.asarray(gc.roles, object)[idx],
                    "bytes": n_bytes,
                    "flops": gc.flops[idx],
                    "device": where_of(rows),
                    "tokens": np.asarray(gc.tokens, object)[idx],
                }
            )
        )
    if not parts:
        return None
    df = pd.concat(parts, ignore_index=True)
    # ops of prompt and generation steps only (not a K-shift's)
    step_kind = kinds.reindex(df["step"].to_numpy()).to_numpy()
    df["kind"] = step_kind
    df = df[np.isin(step_kind, ["prompt", "gen"])]
    # each op's compute: its query rows, and the KV cells they see (flash attention's work)
    at = kv_costs.compute_positions(frames)
    keys = list(zip(df["step"].astype(int), df["ubatch"].astype(int), strict=True))
    spans = [at.get(k, (-1, 0)) for k in keys]
    df = df.assign(
        rows=[n for _p, n in spans],
        cells=[kv_costs.visible_cells(p_, n) if p_ >= 0 else np.nan for p_, n in spans],
    )
    return df


def _devices_of(frames: Any) -> Any:
    """A function giving the device of each op row: the ops frame's ``device`` where the log ran
    on several devices, else the CPU."""

    def of(rows: pd.DataFrame) -> np.ndarray:
        if "device" in rows.columns:
            return rows["device"].astype(str).to_numpy(object)
        return np.full(len(rows), "CPU", object)

    return of


@dataclass
class _Fusion:
    """What a log's graphs say of fusion: (where, label, role) of nodes never timed and of nodes
    timed, and (where, label, label of the first source, on the same device) of each."""

    fused: set[tuple[Where, str, str]] = field(default_factory=set)
    timed: set[tuple[Where, str, str]] = field(default_factory=set)
    after_fused: set[tuple[Where, str, str]] = field(default_factory=set)
    after_timed: set[tuple[Where, str, str]] = field(default_factory=set)


def _fused_roles(frames: Any, graphs: LogGraphs, threads: int, out: _Fusion) -> None:
    """Nodes that are not views yet never timed in any compute of their graph: run inside another
    op (a backend's fusion), by their (where, label, role), where from the split holding the
    node; and the op before each, where it ran on the same device."""
    timed = frames.ops.groupby("graph")["node"].unique()
    for gid, nodes in timed.items():
        if int(gid) not in graphs:
            continue
        gc, device = graphs[int(gid)]
        seen = set(int(x) for x in nodes)
        for node in gc.graph.nodes:
            if "noop" in node.flags or 0 in node.shape:
                continue
            dev = device[node.i]
            where = Where(dev, threads if dev == "CPU" else 0)
            ran = node.i in seen
            (out.timed if ran else out.fused).add((where, node.label, role(node.name)))
            src = first_source(gc.graph, node.i)
            if src is not None and device[src] == dev:
                after = (where, node.label, gc.graph.nodes[src].label)
                (out.after_timed if ran else out.after_fused).add(after)


def _roofs(df: pd.DataFrame) -> Roofs:
    d = df["dur"].to_numpy()
    ok = d > 0
    gbs = df["bytes"].to_numpy()[ok] / d[ok]
    bw = float(np.percentile(gbs, ROOF_PERCENTILE)) if len(gbs) else 0.0
    compute: dict[str, float] = {}
    mm = df[df["label"].str.startswith("MUL_MAT") & (df["dur"] > 0)]
    # (an attention matmul's roof is its cache type's: "kv f16" against f16)
    mm = mm.assign(type0=mm["type0"].str.removeprefix("kv "))
    for t, rows in mm.groupby("type0"):
        rate = rows["flops"].to_numpy() / rows["dur"].to_numpy()
        compute[str(t)] = float(np.percentile(rate, ROOF_PERCENTILE))
    any_rate = max(compute.values()) if compute else 0.0
    fixed = float(np.percentile(d, FIXED_PERCENTILE)) if len(d) else 0.0
    return Roofs(bandwidth=bw, compute=compute, compute_any=any_rate, fixed=fixed)


def _fit(work: np.ndarray, dur: np.ndarray, fixed: float) -> Fit:
    """The class's efficiency against the roof: the slope of its time over its work, through the
    device's fixed cost per op, by least squares over its distinct sizes (each its ops' median
    time, weighted by how many ops had it: a step slowed by another process moves it little).
    (A free intercept per class, fitted on the two or three sizes one run gives, took tens of
    milliseconds for a fixed cost.)"""
    order = np.argsort(work, kind="stable")
    return _fit_sorted(np.asarray(work, np.float64)[order], np.asarray(dur)[order], fixed)


def _class_fits(
    obs: pd.DataFrame,
    where_code: np.ndarray,
    wheres: dict[int, Where],
    work: np.ndarray,
    roofs: dict[Where, Roofs],
) -> dict[ClassKey, Fit]:
    """Each class's ``_fit``: per role, and per op over all roles (for a node whose role no log
    has: another model). Rows are grouped by integer codes of their class's columns, sorted once
    by class and work."""
    cols = [where_code]
    names: list[Any] = [wheres]
    for c in ("tokens", "label", "type0", "role"):
        code, uniq = pd.factorize(obs[c])
        cols.append(code)
        names.append(uniq)
    dur = obs["dur"].to_numpy(np.float64)
    # (a row whose class has a missing value is in no class, as groupby leaves it out)
    keep = np.logical_and.reduce([col >= 0 for col in cols])
    cols = [col[keep] for col in cols]
    work, dur, where_code = work[keep], dur[keep], where_code[keep]
    dims = [int(max(col.max(), 0)) + 1 for col in cols]
    fits: dict[ClassKey, Fit] = {}
    for n_keys in (5, 4):
        key = np.ravel_multi_index(cols[:n_keys], dims[:n_keys])
        order = np.lexsort((work, key))
        k, w, d = key[order], work[order], dur[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(k)) + 1, [len(k)]))
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            i = int(order[a])
            where = wheres[int(where_code[i])]
            parts = [str(names[j][cols[j][i]]) for j in range(1, n_keys)]
            cls = (where, *parts) if n_keys == 5 else (where, *parts, "")
            fits[cls] = _fit_sorted(w[a:b], d[a:b], roofs[where].fixed)  # type: ignore[index]
    return fits


def _stream(
    obs: pd.DataFrame, where_code: np.ndarray, wheres: dict[int, Where]
) -> dict[tuple[Where, str], float]:
    """Per device, the bandwidth (bytes/ns) its ops reached over a whole step, the best step's:
    their bytes over their time, summed over the step's computes, of generation's steps where
    there are some (a prompt's may read a matrix still in the cache). Keyed ``""`` for every op,
    and for the matmuls reading a weight, ``TYPE`` for those of a weight type and
    ``TYPE:ROLE`` for those of one weight matrix of the model in every layer (``ffn_up``): the
    rate its kernel and the memory read it at (a generation step reads every weight once). The
    roofs' bandwidth, the 95th percentile of single ops', is a cache's where an op's data fits."""
    typ = obs["type0"].astype(str)
    weight = (
        obs["label"].astype(str).str.startswith("MUL_MAT") & ~typ.str.startswith("kv ")
    ).to_numpy()
    df = pd.DataFrame(
        {
            "w": where_code,
            "log": obs["log"].to_numpy(),
            "step": obs["step"].to_numpy(),
            "bytes": obs["bytes"].to_numpy(np.float64),
            "dur": obs["dur"].to_numpy(np.float64),
            # generation's steps first: a prompt's may find a matrix in the cache still (its
            # output projection of one row, read just after the previous token's)
            "gen": (obs["kind"].astype(str) == "gen").to_numpy(),
        }
    )
    mm = df[weight]
    keys = (
        df.assign(t=""),
        mm.assign(t=typ.to_numpy()[weight]),
        mm.assign(t=typ.to_numpy()[weight] + ":" + obs["role"].astype(str).to_numpy()[weight]),
    )
    out: dict[tuple[Where, str], float] = {}
    for rows in keys:
        per = rows.groupby(["w", "t", "gen", "log", "step"])[["bytes", "dur"]].sum()
        per = per[per["dur"] > 0]
        rate = (per["bytes"] / per["dur"]).groupby(level=["w", "t", "gen"]).max()
        for (c, t, _gen), v in sorted(rate.items(), key=lambda kv: kv[0][2]):
            out[(wheres[int(c)], str(t))] = float(v)  # generation's, where it has one
    return out


def _fit_sorted(work: np.ndarray, dur: np.ndarray, fixed: float) -> Fit:
    """``_fit`` of a class's ops sorted by their work."""
    starts = np.concatenate(([0], np.flatnonzero(np.diff(work)) + 1))
    ends = np.append(starts[1:], len(work))
    w = work[starts]
    m = np.array([np.median(dur[a:b]) for a, b in zip(starts, ends, strict=True)])
    return _line(w, m, (ends - starts).astype(np.float64), fixed)


def _line(w: np.ndarray, m: np.ndarray, c: np.ndarray, fixed: float) -> Fit:
    """The line through the fixed cost fitted to the sizes' works ``w``, median times ``m`` and
    counts ``c`` (``_fit``)."""
    n = int(c.sum())
    a = min(fixed, float(m.min()))
    den = float(np.sum(c * w * w))
    slope = float(np.sum(c * w * (m - a)) / den) if den > 0 else 0.0
    lo, hi = float(w.min()), float(w.max())
    if slope <= 0:  # no work (or no time beyond the fixed cost): the class's median time
        return Fit(fixed=float(np.average(m, weights=c)), slope=0.0, work_lo=lo, work_hi=hi, n=n)
    return Fit(fixed=a, slope=slope, work_lo=lo, work_hi=hi, n=n)


def _max_kv(frames: Any) -> int:
    """The most KV cells a compute of the log read (``kv_costs.n_kv`` of its end)."""
    n_ctx = int((frames.info.context or {}).get("n_ctx") or 0)
    ends = [p + n for p, n in kv_costs.compute_positions(frames).values()]
    return max((kv_costs.n_kv(e, n_ctx or e) for e in ends), default=0)


def cold_step(frames: Any) -> int | None:
    """The step that started the log's context, None where none did: the session's first step,
    where it begins at position 0 (a context made for the run, its buffers and threads first used
    there, which a run at a depth, its cache filled before, does not pay)."""
    steps = frames.steps
    if steps.empty:
        return None
    first = steps.loc[steps["step"].idxmin()]
    pos = first["pos0"] if "pos0" in steps else 0
    return int(first["step"]) if pos == 0 or pd.isna(pos) else None


def threads_of(frames: Any) -> int:
    return int((frames.info.context or {}).get("n_threads") or 0)


def fit(
    sessions: Iterable[Any],
    graphs: list[LogGraphs] | None = None,
    held_out: bool = True,
    memo: dict[Any, Any] | None = None,
    peaks: op_threads.PeaksAt | None = None,
    matmuls: Callable[[int, int], Any] | None = None,
) -> CostModel:
    """The cost model of the sessions' timed ops (``SessionFrames`` with ops); ``graphs``: their
    ``log_graphs`` where worked out already; ``held_out``: each log also predicted from the others
    (``_held_out``); ``memo``: a dict kept by a caller that fits many sets of the same sessions
    (bench/predict.py, leave one out twice over): each session's graphs and each set's held-out
    model kept there by the sessions' ids, which must stay alive as long as it; ``matmuls``:
    the one-column matmul probe from one thread count to another (``gemv_probe``), or None."""
    fusion = _Fusion()
    sessions = list(sessions)
    if graphs is None:
        memo_ = memo if memo is not None else {}
        for sf in sessions:
            if ("graphs", id(sf)) not in memo_:
                memo_[("graphs", id(sf))] = log_graphs(sf) if not sf.ops.empty else {}
        graphs = [memo_[("graphs", id(sf))] for sf in sessions]
    parts, overhead_rows = _observe(sessions, graphs, fusion)
    if not parts:
        return CostModel(fits={}, roofs={}, fused=set(), overhead={})
    obs = pd.concat(parts, ignore_index=True)
    where_code, wheres, roofs, work = _by_where(obs)
    fits = _class_fits(obs, where_code, wheres, work, roofs)
    stream = _stream(obs, where_code, wheres)
    flash = kv_costs.flash_lines(
        obs.assign(where=[wheres[int(c)] for c in where_code]),
        {w: r.fixed for w, r in roofs.items()},
    )
    over: dict[tuple[Where, str], list[float]] = defaultdict(list)
    warm: dict[tuple[Where, str], list[float]] = defaultdict(list)
    for w, kind, extra, first in overhead_rows:
        over[(w, kind)].append(extra)
        if not first:
            warm[(w, kind)].append(extra)
    model = CostModel(
        fits=fits,
        roofs=roofs,
        fused=fusion.fused,
        timed=fusion.timed,
        fused_after=fusion.after_fused - fusion.after_timed,
        types_run={str(t) for t in obs["type0"].unique()},
        overhead={k: float(np.median(v)) for k, v in over.items()},
        overhead_warm={k: float(np.median(v)) for k, v in warm.items()},
        splits=split_costs.fit(sessions),
        experts=ExpertTraffic.of(sessions) or None,
        stream=stream,
        flash=flash,
        max_kv=max((_max_kv(sf) for sf in sessions), default=0),
    )
    _self_check(model, sessions, graphs)
    if held_out:
        _held_out(model, sessions, graphs, {} if memo is None else memo, peaks or {}, matmuls)
    return model


def _observe(
    sessions: list[Any], graphs: list[LogGraphs], fusion: _Fusion
) -> tuple[list[pd.DataFrame], list[tuple[Where, str, float, bool]]]:
    """Each session's timed ops as rows (its device and thread count, its log's index), the ops
    fused at each (into ``fusion``), and the host's time per compute outside the ops: (where,
    kind, ns, whether the step started its context)."""
    parts: list[pd.DataFrame] = []
    overhead_rows: list[tuple[Where, str, float, bool]] = []
    for sf, g in zip(sessions, graphs, strict=True):
        threads = threads_of(sf)
        df = _op_frame(sf, g, _devices_of(sf))
        if df is None or df.empty:
            continue
        df["threads"] = np.where(df["device"] == "CPU", threads, 0)
        df["log"] = len(parts)
        parts.append(df)
        _fused_roles(sf, g, threads, fusion)
        # the host's time per compute outside the ops (on several devices: outside the devices'
        # own time and the copies, which split_costs prices): graph build, inputs, outputs
        per_step = df.groupby("step").agg(op_ns=("dur", "sum"), computes=("ubatch", "nunique"))
        on_devices = split_costs.device_time(sf)
        steps = sf.steps.set_index("step")
        took = net_costs.step_times(sf)
        cold = cold_step(sf)
        for step, row in per_step.iterrows():
            if step not in steps.index:
                continue
            s = steps.loc[step]
            inside = on_devices.get(int(step), float(row["op_ns"]))
            extra = (took[int(step)] - inside) / max(int(row["computes"]), 1)
            where = Where("CPU", threads)
            overhead_rows.append((where, str(s["kind"]), max(extra, 0.0), step == cold))
    return parts, overhead_rows


def _by_where(
    obs: pd.DataFrame,
) -> tuple[np.ndarray, dict[int, Where], dict[Where, Roofs], np.ndarray]:
    """Each row's (device, thread count) as one code, the ``Where`` of each code, the roofs of
    each and each row's work at its roofs."""
    # each row's device and thread count as one code (Where objects made once per pair)
    dev_code, dev_names = pd.factorize(obs["device"])
    thr_code, thr_names = pd.factorize(obs["threads"])
    where_code = dev_code * len(thr_names) + thr_code
    wheres = {
        int(c): Where(str(dev_names[c // len(thr_names)]), int(thr_names[c % len(thr_names)]))
        for c in np.unique(where_code)
    }
    roofs: dict[Where, Roofs] = {}
    work = np.zeros(len(obs))
    for c, w in wheres.items():
        rows = obs[where_code == c]
        roofs[w] = _roofs(rows)
        work[where_code == c] = roofs[w].work(
            rows["label"].tolist(),
            rows["type0"].tolist(),
            rows["bytes"].to_numpy(),
            rows["flops"].to_numpy(),
        )
    return where_code, wheres, roofs, work


@dataclass
class _Priced:
    """One log's steps priced by a model: per kind, (measured, priced) ns of each step, the
    devices its steps used, and whether every compute of the kind was priced within what the
    model measured (no class missing, no op beyond its class's sizes)."""

    pairs: dict[str, list[tuple[float, float]]]
    used: dict[str, set[str]]
    whole: dict[str, bool]
    cold: dict[str, int] = field(default_factory=dict)  # per kind, the index of its cold step


def _price_log(model: CostModel, sf: Any, log_g: LogGraphs) -> _Priced:
    """Each of a log's steps priced by ``model`` from its own graphs (and the host's overhead per
    compute, and over RPC the session's setup on its first step)."""
    threads = threads_of(sf)
    priced: dict[tuple[int, str, bool, float | None], float] = {}
    computes = sf.ops[["step", "ubatch", "graph"]].drop_duplicates()
    at = kv_costs.compute_positions(sf)
    # where the weights are held: as a graph of one token placed them (split_costs.holders)
    one = next((v for v in log_g.values() if v[0].graph.n_tokens == 1), None)
    held = split_costs.holders(one[0].graph, one[1]) if one is not None else None
    last = -1  # the graph of the previous compute (the same one is not sent again over RPC)
    steps = sf.steps.set_index("step")
    kinds = steps["kind"].astype(str)
    pred: dict[int, float] = defaultdict(float)
    used: dict[str, set[str]] = defaultdict(set)  # per kind, the devices its steps used
    whole: dict[str, bool] = defaultdict(lambda: True)
    for step, ub, gid in computes.itertuples(index=False):
        kind = str(kinds.get(step, ""))
        resend, last = int(gid) != last, int(gid)
        if int(gid) not in log_g or kind not in ("prompt", "gen"):
            continue
        gc, devs = log_g[int(gid)]
        used[kind] |= {d for d, nop in zip(devs, gc.noop, strict=False) if not nop}
        # (flash attention's price depends on the cells its rows see: kv_costs)
        span = at.get((int(step), int(ub)))
        cells = (
            float(kv_costs.visible_cells(*span))
            if span is not None and kv_costs.FLASH in gc.labels
            else None
        )
        key = (int(gid), kind, resend, cells)
        if key not in priced:
            beyond: dict[tuple[str, str, str, str], float] = {}
            t, extra, missing, lost = model.price_compute(
                gc, devs, threads, kind, resend, held if gc.graph.n_tokens > 1 else None,
                None, beyond, None, None, cells,
            )  # fmt: skip
            ok = not missing and not lost
            priced[key] = float(t.sum() + sum(extra.values())) if ok else np.nan
            whole[kind] = whole[kind] and ok and not beyond
        pred[step] += priced[key] + model.overhead_at(threads, kind)
    if pred and net_costs.is_rpc_log(sf):
        # the session's first step allocated its compute buffers on the servers
        pred[min(pred)] += model.splits.net.setup_ns()
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    took = net_costs.step_times(sf)
    cold = cold_step(sf)
    first: dict[str, int] = {}
    for step, p in pred.items():
        if p > 0:
            kind = str(kinds[step])
            if step == cold:
                first[kind] = len(pairs[kind])
            pairs[kind].append((took[int(step)], p))
    return _Priced(dict(pairs), dict(used), dict(whole), first)


def _self_check(model: CostModel, sessions: list[Any], graphs: list[LogGraphs]) -> None:
    """Per kind, each logged step's measured time against the model's price of it (its own
    graphs, its own overhead): how far the fit strays on the data it was fitted on."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    levels: dict[str, list[float]] = defaultdict(list)
    levels_on: dict[tuple[str, frozenset[str]], list[float]] = defaultdict(list)
    warm: dict[str, list[float]] = defaultdict(list)
    for sf, log_g in zip(sessions, graphs, strict=True):
        if sf.ops.empty:
            continue
        mine = _price_log(model, sf, log_g)
        for kind, pairs in mine.pairs.items():
            out[kind] += pairs
            a = np.asarray(pairs)
            levels[kind].append(float(a[:, 0].sum() / a[:, 1].sum()))
            levels_on[(kind, frozenset(mine.used[kind]))].append(levels[kind][-1])
            if kind in mine.cold:
                a = np.delete(a, mine.cold[kind], axis=0)
            if len(a):
                warm[kind].append(float(a[:, 0].sum() / a[:, 1].sum()))
    for kind, pairs in out.items():
        a = np.asarray(pairs)
        model.self_ratios[kind] = a[:, 0] / a[:, 1]
        model.self_level[kind] = float(np.median(levels[kind]))
    model.self_level_on = {k: float(np.median(v)) for k, v in levels_on.items()}
    model.self_level_warm = {k: float(np.median(v)) for k, v in warm.items()}


def _held_out(
    model: CostModel,
    sessions: list[Any],
    graphs: list[LogGraphs],
    memo: dict[Any, Any],
    peaks: op_threads.PeaksAt,
    matmuls: Callable[[int, int], Any] | None = None,
) -> None:
    """Leave one out over the logs: each log's own setting predicted by the model of the others
    (fitted on them alone, its level theirs), where they cover it whole (every class measured,
    no op beyond its class's sizes); per kind the log of its measured time over that prediction
    (``CostModel.held_out``), what a prediction's interval is made of (``intervals``). A log at a
    CPU thread count the others did not run is priced from theirs (``op_threads``, with the
    ``peaks`` of both counts, and the probe ``matmuls`` gives; not held out without the peaks)
    and its residual kept apart (``held_out_threads``)."""
    for i, (sf, log_g) in enumerate(zip(sessions, graphs, strict=True)):
        if sf.ops.empty:
            continue
        others = [k for k in range(len(sessions)) if k != i and not sessions[k].ops.empty]
        if not others:
            continue
        key = ("fit", frozenset(id(sessions[k]) for k in others))
        if key not in memo:
            memo[key] = fit([sessions[k] for k in others], [graphs[k] for k in others], False)
        m = memo[key]
        threads = threads_of(sf)
        across = threads not in op_threads.cpu_threads(m)
        if across:  # a thread count the others did not run: priced from theirs
            scaled = op_threads.scale(m, threads, peaks)
            if scaled is None:
                continue
            src = op_threads.source(m, threads)
            probe = matmuls(src, threads) if matmuls is not None and src is not None else None
            m = op_threads.with_probe(scaled, threads, probe)
        into = model.held_out_threads if across else model.held_out
        mine = _price_log(m, sf, log_g)
        for kind, pairs in mine.pairs.items():
            level = m.level(kind, frozenset(mine.used.get(kind, set())))
            if not mine.whole.get(kind) or not pairs or not level:
                continue
            a = np.asarray(pairs)
            into.setdefault(kind, []).append(float(np.log(a[:, 0].sum() / (a[:, 1].sum() * level))))
