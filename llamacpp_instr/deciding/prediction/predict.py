"""Tokens/s for a setting not run (``instr predict``), priced op by op from runs that were.

The new setting's graphs are built for real, by the machine the caller hands in
(``deciding.measures.Machine``): the model is loaded without its weights (its ``Meter``, no_alloc), a context is made at each KV size the run would reach, and llama.cpp builds
and ggml's scheduler splits the graph of each ubatch it would compute
(``llama_instr_graph_reserve``), never computing it. Each node is then priced by the cost model
the logs' measured ops give (``converters.analysis.op_costs``), each ubatch's compute adds the host
time the logs measured outside the ops, and the steps add up to tokens/s.

A prediction is labelled as one. It is scaled by each log's whole measured time over its whole
price, the median over the logs whose steps computed on the devices the target's do (so that one
log predicts itself; 1 where no log's did: a CPU alone at -ngl 0 from logs that offloaded layers).
Its 95 % interval is made of the logs predicted from each other, leave one out (``intervals``; with
one log, the model's spread on its own steps). A CPU thread count no log ran is priced from the
nearest one run, a generated token's matmuls by graphs of their own weight shapes run at both
counts in turn on the logs' machine (``gemv_probe``), else by the one-column matmul ``instr
peaks`` measured for their weight type at both counts, other memory-bound ops at the bandwidth it
measured at the new count, compute-bound matmuls at the matmul throughput it measured for their weight type and
other compute-bound ops by the threads (``op_threads``), up to the CPUs of the logs' machine;
without those peaks it is not covered. Attention on more KV cells than the logs read is measured
at that depth by the probe on the logs' machine (``kv_probe``), elsewhere priced by its cost per
cell, an extrapolation said so, up to what the bench checks (``kv_costs``); a prompt after a
depth is priced at the steps that did not start their context (``op_fit.cold_step``). On several
devices each
split adds its device's time beyond its ops and the copies into it
(``converters.analysis.split_costs``), the weights included that ggml copies to a GPU to run a
large batch's matmul there though they are held on the host (op offload: a prompt at -ngl 0 on a
Vulkan build), held where the graph of one token places them (``GraphBuilder.holders``). An RPC
server's ops are priced from the ops it timed itself, and its network command by command from the
link the log measured or the one given (``--rpc-rate``, ``--rpc-rtt``:
``converters.analysis.net_costs``); a step over RPC lasts until its outputs are read
(``token_time``), not until llama_decode returns. The log's RPC servers are stood in for on
loopback to build the graphs (``rpc_standin``). Whatever the logs have no measure for (an op on a
device no log ran, threads beyond the machine's CPUs, a weight type never run, a split or a copy
between devices no log made, a link no log measured, an op of more work than its class's ops did in
the logs: a longer prompt, a context deeper than ``kv_costs`` allows) is reported with what to run
to measure it, and that speed is not given. A setting needing more context than the model was
trained on (``n_ctx_train``) is refused. An op its device never ran, of a kind it did (a matmul of
a weight type the logs ran on another device only: the output projection on the CPU at -ngl 0, from
logs that offloaded the output layer), is priced from that kind and listed in
``priced_from_others`` (``op_costs.proxy``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis import contention
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.converters.analysis.frames import load_session as load_session
from llamacpp_instr.deciding.measures import Machine
from llamacpp_instr.deciding.prediction import net_costs, op_fit, op_threads, predict_lines
from llamacpp_instr.deciding.prediction.intervals import interval
from llamacpp_instr.deciding.prediction.kv_costs import KV_PAD
from llamacpp_instr.deciding.prediction.op_costs import CostModel, Where
from llamacpp_instr.deciding.prediction.predict_lines import bounds_line
from llamacpp_instr.deciding.prediction.pricing import GraphBuilder as GraphBuilder
from llamacpp_instr.deciding.prediction.pricing import Pricing
from llamacpp_instr.deciding.prediction.target import Prediction as Prediction
from llamacpp_instr.deciding.prediction.target import Target as Target
from llamacpp_instr.deciding.prediction.target import computes as computes
from llamacpp_instr.deciding.prediction.target import default_target as default_target
from llamacpp_instr.deciding.prediction.target import load_logs as load_logs

# the peaks of two thread counts measured further apart than this (s) are said to be: their
# ratio is what prices one count from the other
APART_S = 120


def predict(
    logs: list[Path], machine: Machine, t: Target | None = None, **changes: Any
) -> Prediction:
    """Predict ``t`` (default: the first log's own setting, with ``changes``) from the logs, on
    ``machine``."""
    sessions = load_logs(logs)
    base = t or default_target(sessions[0], changes.pop("model", None))
    target = replace(base, **{k: v for k, v in changes.items() if v is not None})
    model = fit(sessions, machine=machine)
    return price(target, model, sessions, [str(p) for p in logs], machine)


def fit(
    sessions: list[SessionFrames],
    graphs: list[op_fit.LogGraphs] | None = None,
    held_out: bool = True,
    memo: dict[Any, Any] | None = None,
    peaks_dir: Path | None = None,
    machine: Machine | None = None,
) -> CostModel:
    """The cost model of the logs (``op_fit.fit``), with the peaks ``instr peaks`` measured of
    their machine at their thread counts (in ``peaks_dir``, default the cache's): a log held out
    at a thread count the others did not run is priced with them, and where a ``machine`` is
    given its generated token's matmuls measured as ``price`` measures them (its ``matmuls``)."""
    counts = sorted({n for n in map(op_fit.threads_of, sessions) if n > 0})
    peaks = op_threads.cpu_peaks(_machine(sessions), counts, _peaks_dir(peaks_dir))
    machines = [getattr(sf.info, "machine", None) for sf in sessions]

    def matmuls(source: int, target: int) -> Any:
        return machine.matmuls(machines, source, target) if machine is not None else None

    return op_fit.fit(sessions, graphs, held_out, memo, peaks if len(counts) > 1 else {}, matmuls)


def _machine(sessions: list[SessionFrames]) -> dict[str, Any] | None:
    """The machine the first log names (what its peaks are cached by)."""
    return getattr(sessions[0].info, "machine", None) if sessions else None


def _peaks_dir(given: Path | None) -> Path:
    from llamacpp_instr.native.paths import cache_dir

    return given if given is not None else cache_dir()


def price(
    t: Target,
    model: CostModel,
    sessions: list[SessionFrames],
    names: list[str],
    machine: Machine,
    peaks_dir: Path | None = None,
    probe: bool = True,
) -> Prediction:
    """Price every compute of ``t`` with ``model`` (the graphs built by llama.cpp on
    ``machine``); a CPU thread count no log ran with the peaks cached in ``peaks_dir`` (default:
    the cache's); attention beyond the logs' KV cells measured by the machine's probe where
    ``probe`` and it is the logs' machine (``kv_probe``), else by its line per cell."""
    if t.n_prompt <= 0 and t.n_gen <= 0:
        raise UserError(
            "nothing to predict: a prompt of 0 tokens and 0 generated (give --prompt-tokens or "
            "-n above 0)"
        )
    out = Prediction(target=t, logs=names)
    busy = [(n, contention.verdict(sf.steps)) for n, sf in zip(names, sessions, strict=False)]
    out.contended = [f"{n}: {v.line()}" for n, v in busy if v.flagged]
    if t.rpc_rate is not None or t.rpc_rtt_ns is not None:
        # the same servers on another link (module net_costs)
        net = model.splits.net.with_link(t.rpc_rate, t.rpc_rtt_ns)
        model = replace(model, splits=replace(model.splits, net=net))
    out.links = {
        d: {"rate_bits_per_s": lk.rate_bits, "rtt_ns": lk.rtt_ns}
        for d, lk in sorted(model.splits.net.links.items())
    }
    scaled = _at_threads(t, model, sessions, out, _peaks_dir(peaks_dir), machine if probe else None)
    if scaled is None:
        return out
    model = scaled
    builder = GraphBuilder(t, machine)
    try:
        _check_model(t, builder, sessions)
        prompt, gen = computes(t)
        pricing = Pricing(
            builder,
            t,
            _attention_probe(t, sessions, builder.prober.n_layer, machine) if probe else None,
        )
        for kind, plan, tokens in (("prompt", prompt, t.n_prompt), ("gen", gen, t.n_gen)):
            if not plan:
                continue
            first = kind == ("prompt" if prompt else "gen")
            total, used = pricing.kind(model, kind, plan, first, out)
            out.graphs = len(builder.cache)
            if total is None:
                continue
            deeper = pricing.deeper.get(kind, False) or kind in pricing.measured
            warm = t.depth > 0 and first
            iv = interval(
                tokens, total, model, kind, used, bool(out.threads_from), warm, deeper,
                pricing.measured.get(kind, 0.0),
            )  # fmt: skip
            if kind == "prompt":
                out.prompt = iv
            else:
                out.gen = iv
        out.not_covered = list(pricing.missing)
        out.priced_from_others = list(pricing.proxies)
        out.extrapolated = list(pricing.extrapolated)
        out.measured_attention = {
            kind: {"ns": ns, "ops": list(pricing.probed[kind].values())}
            for kind, ns in pricing.measured.items()
        }
        if out.op_bounds:
            out.threads_from += "; " + bounds_line(out.op_bounds)
        out.measured_matmuls = _measured_matmuls(model, t.threads, out)
    finally:
        builder.close()
    return out


def _attention_probe(
    t: Target, sessions: list[SessionFrames], n_layer: int, machine: Machine
) -> Any:
    """The machine's attention probe at the target's threads and context, over as many bytes as
    a token of the target reads (its file's weights, its ``n_layer`` layers' caches), None where
    the machine is not the logs' (what it measures would not be what they ran on)."""
    logged = [getattr(sf.info, "machine", None) for sf in sessions]
    n_ctx = -(-(t.depth + t.n_prompt + t.n_gen + 1) // KV_PAD) * KV_PAD
    return machine.attention(logged, t.threads, n_ctx, t.model.stat().st_size, n_layer)


def _check_model(t: Target, builder: GraphBuilder, sessions: list[SessionFrames]) -> None:
    """Refuse a setting beyond the model's n_ctx_train, or a model of another architecture than
    the logs' (one line each)."""
    n_train = builder.prober.n_ctx_train
    need = t.depth + t.n_prompt + t.n_gen
    if n_train > 0 and need > n_train:
        raise UserError(
            f"a depth of {t.depth}, a {t.n_prompt}-token prompt and {t.n_gen} generated need "
            f"{need} tokens of context, beyond the {n_train} {t.model.name} was trained on "
            "(its n_ctx_train): not predicted"
        )
    arch = builder.architecture()
    for sf in sessions:
        logged = str((sf.info.model or {}).get("architecture") or "")
        if arch and logged and logged != arch:
            raise UserError(
                f"{t.model.name} is a {arch} model, the logs ran a {logged} one: their ops "
                "cannot price it"
            )


def _cores(sessions: list[SessionFrames]) -> int | None:
    """The CPUs of the logs' machine (the fewest any log names), None where none says."""
    n = [int((getattr(sf.info, "machine", None) or {}).get("n_cpus") or 0) for sf in sessions]
    return min((x for x in n if x > 0), default=None)


def _measured_matmuls(model: CostModel, threads: int, out: Prediction) -> dict[str, float]:
    """The one-column matmuls the probe measured at both counts (``gemv_probe``), each weight's
    speed-up; what it could not measure added to ``out.not_covered``'s neighbour, the threads'
    line."""
    scale = model.scaled.get(Where("CPU", threads))
    probe = scale.probe if scale is not None else None
    if probe is None:
        return {}
    if probe.failed:
        out.threads_from += "; not measured by the probe: " + "; ".join(probe.failed)
    return {f"{w} {k}x{m}": v for (w, k, m), v in sorted(probe.speedups.items())}


def _at_threads(
    t: Target,
    model: CostModel,
    sessions: list[SessionFrames],
    out: Prediction,
    peaks_dir: Path,
    machine: Machine | None = None,
) -> CostModel | None:
    """The model to price ``t`` with: at a CPU thread count no log ran, priced from the nearest
    one run with the peaks of both (``op_threads``), a generated token's matmuls measured at both
    by the ``machine``'s probe where given and it is the logs' (``gemv_probe``); None where that
    is beyond the logs' machine's cores or the peaks are not measured (not covered, said in
    ``out``)."""
    have = op_threads.cpu_threads(model)
    if not have or t.threads in have:
        return model
    cores = _cores(sessions)
    if t.threads > (cores or max(have)):
        out.not_covered.append(predict_lines.too_many_threads_line(t, cores, have))
        return None
    src = op_threads.source(model, t.threads)
    assert src is not None
    peaks = op_threads.cpu_peaks(_machine(sessions), [src, t.threads], peaks_dir)
    scaled = op_threads.scale(model, t.threads, peaks)
    if scaled is None:
        out.not_covered.append(predict_lines.no_peaks_line(t, src, have, peaks))
        return None
    machines = [getattr(sf.info, "machine", None) for sf in sessions]
    mm_probe = machine.matmuls(machines, src, t.threads) if machine is not None else None
    out.threads_from = predict_lines.threads_line(t, src, scaled, peaks, mm_probe is not None)
    apart = op_threads.apart_s(peaks, [src, t.threads])
    if apart > APART_S:
        out.threads_from += (
            f"; the peaks of the two counts were measured {apart / 60:.0f} minutes apart (a shared "
            f"machine moves their ratio by a quarter): {op_threads.peaks_command([src, t.threads])} "
            "measures them in turns"
        )
    return op_threads.with_probe(scaled, t.threads, mm_probe)


def measured_shares(sf: SessionFrames) -> dict[str, dict[str, float]]:
    """Per kind, a log's time on each device (by each device's own measure: ``device_steps``) and
    in copies between them, as shares of their sum: what ``Prediction.by_device`` predicts. {} for
    a log on one device."""
    ds = sf.device_steps
    if ds is None or ds.empty:
        return {}
    out: dict[str, dict[str, float]] = {}
    copies = sf.copies
    rpc = net_costs.is_rpc_log(sf)
    for kind in ("prompt", "gen"):
        rows = ds[(ds["kind"].astype(str) == kind) & (ds["step"] >= 0)]
        if rows.empty:
            continue
        per = rows.groupby("device", observed=True)["compute_ns"].sum().astype(float).to_dict()
        steps = set(rows["step"].tolist())
        if rpc:
            # the network: data moving on the connections while no device computed (a copy to
            # or from a server is its commands, and its host time holds the server's compute)
            tt = sf.token_time
            per["network"] = float(tt.loc[tt["step"].isin(steps), "transfer_ns"].sum())
        else:
            per["copies"] = (
                float(copies.loc[copies["step"].isin(steps), "dur_ns"].sum())
                if copies is not None and not copies.empty
                else 0.0
            )
        total = sum(per.values()) or 1.0
        out[kind] = {str(d): v / total for d, v in sorted(per.items())}
    return out


def measured(sf: SessionFrames) -> dict[str, float | None]:
    """A log's own prompt and generation tokens/s (tokens over llama_decode time, per kind): what
    a prediction of its setting is checked against."""
    out: dict[str, float | None] = {}
    took = net_costs.step_times(sf)
    for kind in ("prompt", "gen"):
        s = sf.steps[sf.steps["kind"].astype(str) == kind]
        dur = float(sum(took[int(x)] for x in s["step"]))
        out[kind] = float(s["n_tokens"].sum()) * 1e9 / dur if dur > 0 else None
    return out
