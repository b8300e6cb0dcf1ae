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

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis import contention
from llamacpp_instr.converters.analysis.frames import SessionFrames, load_session
from llamacpp_instr.converters.analysis.probe_shapes import attention_shape
from llamacpp_instr.converters.reading.decode.graphs import graph_table
from llamacpp_instr.deciding.measures import Machine, Meter
from llamacpp_instr.deciding.prediction import net_costs, op_fit, op_threads, split_costs
from llamacpp_instr.deciding.prediction.intervals import Interval, interval
from llamacpp_instr.deciding.prediction.kv_costs import (
    FLASH,
    KV_EXTRAPOLATION,
    KV_PAD,
    n_kv,
    visible_cells,
)
from llamacpp_instr.deciding.prediction.op_costs import CostModel, GraphCosts, Where
from llamacpp_instr.running import context_defaults, devices, offload
from llamacpp_instr.running.run_config import RunConfig
from llamacpp_instr.running.tensor_overrides import TensorOverrides

# the peaks of two thread counts measured further apart than this (s) are said to be: their
# ratio is what prices one count from the other
APART_S = 120


@dataclass(frozen=True)
class Target:
    """The setting to predict: what ``instr run`` would be given."""

    model: Path
    threads: int
    n_prompt: int  # prompt tokens
    n_gen: int  # generation steps (one token each)
    depth: int  # KV cells in use before the prompt (llama-bench's -d)
    n_batch: int
    n_ubatch: int
    flash_attn: bool | None = False  # None: llama.cpp's auto (a setting to plan)
    type_k: str = "f16"
    type_v: str = "f16"
    offload: offload.Offload = field(default_factory=offload.Offload)
    # RPC servers the log ran on (stood in for while building graphs, unless offload.rpc names
    # live ones), and the link to price them at: bits/s and round trip (ns), None for the log's
    rpc_servers: int = 0
    rpc_rate: float | None = None
    rpc_rtt_ns: float | None = None
    # which weight tensors go where (-ot, --n-cpu-moe: a mixture of experts' placement)
    tensors: TensorOverrides = field(default_factory=TensorOverrides)

    def describe(self) -> str:
        depth = f" at depth {self.depth}" if self.depth else ""
        servers = len(self.offload.rpc) or self.rpc_servers
        link = ""
        if servers:
            rate = f"{self.rpc_rate / 1e6:g} Mbit/s" if self.rpc_rate else "the log's rate"
            rtt = f"{self.rpc_rtt_ns / 1e6:g} ms" if self.rpc_rtt_ns is not None else "the log's"
            link = f", {servers} RPC server(s) at {rate}, round trip {rtt}"
        return (
            f"{self.model.name}, {self.threads} threads, a {self.n_prompt}-token prompt "
            f"(ubatch {self.n_ubatch}){depth}, {self.n_gen} generated{link}"
        )


@dataclass
class Prediction:
    target: Target
    logs: list[str]
    prompt: Interval | None = None
    gen: Interval | None = None
    # per kind ("prompt", "gen"): the predicted share of time per device and per op
    by_device: dict[str, dict[str, float]] = field(default_factory=dict)
    by_op: dict[str, dict[str, float]] = field(default_factory=dict)
    graphs: int = 0  # graphs llama.cpp built for it
    # per RPC device, the link its network was priced at: rate_bits_per_s, rtt_ns
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    not_covered: list[str] = field(default_factory=list)
    # op classes no log ran on their device, priced from others of their kind it ran (op_costs)
    priced_from_others: list[str] = field(default_factory=list)
    # logs whose steps spread like a contended machine's: "LOG: what its figures are worth"
    contended: list[str] = field(default_factory=list)
    # attention ops on more KV cells than the logs' read, priced per cell (op_costs'
    # KV_EXTRAPOLATION): an extrapolation, each line what and how far
    extrapolated: list[str] = field(default_factory=list)
    # attention beyond the logs' KV cells, measured by the probe (kv_probe): per kind, its time
    # over the anchors' in all (ns) and each op measured (op, rows, n_kv, us a layer)
    measured_attention: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a thread count no log ran: from which it was priced, and how (op_threads); per kind, the
    # share of the CPU's predicted time of each op there by what it is (thread_scale: memory-bound,
    # compute-bound, on one thread)
    threads_from: str = ""
    op_bounds: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # there, the one-column matmuls measured on this machine at both counts (gemv_probe): per
    # weight ("TYPE KxM"), how much faster at the target's count
    measured_matmuls: dict[str, float] = field(default_factory=dict)

    def covered(self, kind: str) -> float | None:
        """``kind``'s (``prompt``, ``gen``) predicted tokens/s, or None where it was not predicted
        or something of the setting was not covered (what a plan ranks by)."""
        iv = self.prompt if kind == "prompt" else self.gen
        return iv.value if iv and not self.not_covered else None

    def to_json(self) -> dict[str, Any]:
        t = asdict(self.target)
        t["model"] = str(self.target.model)
        t.pop("offload")
        t["tensors"] = self.target.tensors.describe()
        return {
            "prediction": True,
            "setting": t,
            "logs": self.logs,
            "prompt_tokens_per_s": self.prompt.to_json() if self.prompt else None,
            "gen_tokens_per_s": self.gen.to_json() if self.gen else None,
            "by_device": self.by_device,
            "by_op": self.by_op,
            "graphs_built": self.graphs,
            "rpc_links": self.links,
            "not_covered": self.not_covered,
            "priced_from_others": self.priced_from_others,
            "contended": self.contended,
            "extrapolated": self.extrapolated,
            "measured_attention": self.measured_attention,
            "threads_from": self.threads_from or None,
            "op_bounds": self.op_bounds,
            "measured_matmuls": self.measured_matmuls,
        }


def load_logs(paths: list[Path]) -> list[SessionFrames]:
    """Each log's latest session, each with op times (a one-line UserError otherwise)."""
    out = []
    for p in paths:
        sf = load_session(p)
        if sf.ops.empty:
            raise UserError(
                f"{p} has no op times (recorded at {sf.info.level}): predict needs a detailed "
                "log (instr run --level detailed)"
            )
        out.append(sf)
    return out


def default_target(sf: SessionFrames, model: Path | None) -> Target:
    """The setting of the log ``sf`` itself, on ``model`` if given."""
    ctx = sf.info.context or {}
    path = model or Path(str((sf.info.metadata or {}).get("model_path") or ""))
    if not str(path) or not path.is_file():
        raise UserError(
            f"the model the log ran ({path or 'not named in the log'}) is not here: give --model"
        )
    steps = sf.steps
    prompt = steps[steps["kind"].astype(str) == "prompt"]
    gen = steps[steps["kind"].astype(str) == "gen"]
    depth = int(steps["pos0"].min()) if len(steps) and "pos0" in steps else 0
    # where instr run put the layers (its config, in the log's metadata)
    logged = ((sf.info.metadata or {}).get("config") or {}).get("offload") or {}
    # (not its RPC servers, which may be gone: --rpc names them again)
    devs, split = logged.get("devices"), logged.get("tensor_split")
    placed = offload.Offload(
        gpu_layers=logged.get("gpu_layers") or 0,
        devices=tuple(devs) if devs else None,
        tensor_split=tuple(split) if split else None,
        repack=bool(logged.get("repack", True)),
    )
    devs = sf.devices
    n_rpc = int((devs["backend"].astype(str) == "RPC").sum()) if not devs.empty else 0
    return Target(
        tensors=logged_tensors(sf),
        rpc_servers=n_rpc,
        model=path,
        threads=int(ctx.get("n_threads") or 1),
        n_prompt=int(prompt["n_tokens"].sum()),
        n_gen=int(len(gen)),
        depth=max(depth, 0),
        n_batch=int(ctx.get("n_batch") or 512),
        n_ubatch=int(ctx.get("n_ubatch") or ctx.get("n_batch") or 512),
        flash_attn=bool(ctx.get("flash_attn")),
        type_k=str(ctx.get("type_k") or "f16"),
        type_v=str(ctx.get("type_v") or "f16"),
        offload=placed,
    )


def logged_tensors(sf: SessionFrames) -> TensorOverrides:
    """The tensor overrides (-ot, --n-cpu-moe) instr run loaded the log's model with."""
    cfg = (sf.info.metadata or {}).get("config") or {}
    rules = (cfg.get("tensors") or {}).get("rules") if isinstance(cfg, dict) else None
    if not isinstance(rules, list):
        return TensorOverrides()
    return TensorOverrides(
        tuple(
            (str(r[0]), str(r[1]))
            for r in rules
            if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
        )
    )


def computes(t: Target) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (n_tokens, n_kv) of each compute the run makes: its prompt's ubatches, then one per
    generated token."""
    n_ctx = -(-(t.depth + t.n_prompt + t.n_gen + 1) // KV_PAD) * KV_PAD
    prompt: list[tuple[int, int]] = []
    pos = t.depth
    left = t.n_prompt
    while left > 0:
        batch = min(left, t.n_batch)
        left -= batch
        while batch > 0:
            n = min(batch, t.n_ubatch)
            batch -= n
            pos += n
            prompt.append((n, n_kv(pos, n_ctx)))
    gen = [(1, n_kv(pos + k + 1, n_ctx)) for k in range(t.n_gen)]
    return prompt, gen


def compute_cells(t: Target) -> tuple[list[int], list[int]]:
    """The KV cells each compute of ``computes`` has its rows see (``kv_costs.visible_cells``:
    flash attention's work)."""
    prompt, gen = computes(t)
    out: list[int] = []
    pos = t.depth
    for n, _kv in prompt:
        out.append(visible_cells(pos, n))
        pos += n
    return out, [visible_cells(pos + k, 1) for k in range(len(gen))]


class GraphBuilder:
    """The target's graphs, built by llama.cpp without weights on ``machine``, one per (n_tokens,
    n_kv); the logs' RPC servers stood in for where the target names none."""

    def __init__(self, t: Target, machine: Machine) -> None:
        from llama_cpp import _logger

        _logger.set_verbose(False)
        machine.load()
        placed = machine.stand_ins(t.offload, t.rpc_servers)
        devices.add_rpc_servers(placed.rpc)
        self.prober: Meter = machine.meter(t.model, placed, t.tensors)
        self.target = t
        self.cache: dict[tuple[int, int], tuple[GraphCosts, list[str]]] = {}

    def architecture(self) -> str:
        return self.prober.architecture()

    def graph(self, n_tokens: int, kv: int) -> tuple[GraphCosts, list[str]]:
        key = (n_tokens, kv)
        if key not in self.cache:
            t = self.target
            cfg = RunConfig(
                model=t.model,
                prompt="",
                n_ctx=kv,
                n_batch=n_tokens,
                n_ubatch=n_tokens,
                threads=t.threads,
                flash_attn=t.flash_attn,
                type_k=t.type_k,
                type_v=t.type_v,
            )
            rec = self.prober.graph(cfg, n_tokens)
            g = graph_table(rec)
            devs = [str(d) if d else "CPU" for d in rec.get("devices", [])]
            self.cache[key] = (GraphCosts.of(g), devs)
        return self.cache[key]

    def holders(self, n_tokens: int, kv: int) -> split_costs.Holders | None:
        """Where the weights a compute of ``n_tokens`` reads are held, where its graph runs on
        several devices and may offload ops (``split_costs.holders``, from the graph of one
        token at the same KV size); None for one token or one device."""
        gc, devs = self.graph(n_tokens, kv)
        if n_tokens <= 1 or len(set(devs)) <= 1:
            return None
        one, one_devs = self.graph(1, kv)
        return split_costs.holders(one.graph, one_devs)

    def close(self) -> None:
        self.prober.close()


def _advice(t: Target, where: str) -> str:
    if where.startswith("RPC"):
        # a stock server times nothing (the log's remote_timing: false): no run of it can help
        return (
            "an RPC server's ops are timed only by the patched ggml-rpc-server (`instr build "
            "--tools`, then `instr doctor --tools` says where it is): run the hosts on it (detailed) and "
            "add that log"
        )
    threads = f" --threads {t.threads}" if "threads" in where else ""
    return f"run `instr run {t.model}{threads}` (detailed) and add its log"


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
        pricing = _Pricing(
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
    ran = ", ".join(map(str, have))
    if t.threads > (cores or max(have)):
        why = (
            f"the logs' machine has {cores} CPUs, so threads would take turns on them"
            if cores
            else "the logs do not say how many CPUs their machine has"
        )
        out.not_covered.append(
            f"the CPU at {t.threads} threads: {why} (the logs ran {ran}); "
            f"run `instr run {t.model} --threads {t.threads}` (detailed) on the machine it is for "
            "and add its log"
        )
        return None
    src = op_threads.source(model, t.threads)
    assert src is not None
    peaks = op_threads.cpu_peaks(_machine(sessions), [src, t.threads], peaks_dir)
    scaled = op_threads.scale(model, t.threads, peaks)
    if scaled is None:
        lacking = [n for n in (src, t.threads) if n not in peaks]
        out.not_covered.append(
            f"the CPU at {t.threads} threads: no log ran it (the logs ran {ran}), and "
            f"instr peaks has not measured this machine's bandwidth and the cost of starting the "
            f"threads at {' and '.join(map(str, lacking))} thread(s), which price it from the logs' "
            f"{src}: run {op_threads.peaks_command([src, t.threads])} on it (both counts, in "
            f"turns: their ratio prices one from the other), then predict again (or run "
            f"`instr run {t.model} --threads {t.threads}` (detailed) and add its log)"
        )
        return None
    at, to = peaks[src], peaks[t.threads]
    types = op_threads.unmeasured_types(scaled, t.threads, peaks)
    unmeasured = (
        f"; no matmul peak of {', '.join(types)} at both counts (a peaks file measured without "
        f"it), its compute priced by the threads: run "
        f"{op_threads.peaks_command([src, t.threads])} to measure it"
        if types
        else ""
    )
    no_gemv = sorted(
        w
        for w in {k for k in scaled.scaled[Where("CPU", t.threads)].streams if k and ":" not in k}
        if scaled.scaled[Where("CPU", t.threads)].gemv_rates(w) is None
    )
    gemv = (
        f" (not measured for {', '.join(no_gemv)}: as the other matmuls; "
        f"{op_threads.peaks_command([src, t.threads])} measures it)"
        if no_gemv
        else ""
    )
    machines = [getattr(sf.info, "machine", None) for sf in sessions]
    mm_probe = machine.matmuls(machines, src, t.threads) if machine is not None else None
    scaled = op_threads.with_probe(scaled, t.threads, mm_probe)
    if mm_probe is not None:
        how = (
            "a generated token's matmuls by graphs of their own weights' shapes run on this "
            f"machine at both counts in turns (the shapes holding most of their bytes; the others "
            f"as their type's, else as the one-column matmul instr peaks measured{gemv})"
        )
    else:
        how = (
            "a generated token's matmuls by the one-column matmul instr peaks measured for their "
            f"weight type at each count{gemv}"
        )
    out.threads_from = (
        f"{t.threads} threads priced from the logs' {src}: {how}, "
        f"other memory-bound ops at the bandwidth "
        f"instr peaks measured at {t.threads} ({to.bandwidth:.1f} GB/s; at {src}, "
        f"{at.bandwidth:.1f} GB/s), compute-bound matmuls at the matmul throughput it measured "
        f"for their weight type at each, other compute-bound ops by the threads (an op of one "
        f"row on one thread at both), each compute's start of the threads at its measured cost "
        f"({to.sync_ns / 1e3:.2f} us at {t.threads}, {at.sync_ns / 1e3:.2f} at {src}){unmeasured}"
    )
    apart = op_threads.apart_s(peaks, [src, t.threads])
    if apart > APART_S:
        out.threads_from += (
            f"; the peaks of the two counts were measured {apart / 60:.0f} minutes apart (a shared "
            f"machine moves their ratio by a quarter): {op_threads.peaks_command([src, t.threads])} "
            "measures them in turns"
        )
    return scaled


class _Pricing:
    """The computes of a target priced kind by kind, what no log measured gathered across them."""

    def __init__(self, builder: GraphBuilder, t: Target, probe: Any = None) -> None:
        self.builder = builder
        self.t = t
        self.probe = probe
        self.missing: dict[str, None] = {}
        self.proxies: dict[str, None] = {}
        self.extrapolated: dict[str, None] = {}
        self.deeper: dict[str, bool] = {}  # per kind: whether an attention op was extrapolated
        # per kind: attention beyond the logs' KV cells measured by the probe (kv_probe), its
        # time over the anchor's (ns, the kind's computes together), and what was measured
        self.measured: dict[str, float] = {}
        self.probed: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = defaultdict(dict)

    def kind(
        self,
        model: CostModel,
        kind: str,
        plan: list[tuple[int, int]],
        first: bool,
        out: Prediction | None = None,
    ) -> tuple[float | None, frozenset[str]]:
        """A kind's computes (``plan``; ``first``: the session's first, which allocates the RPC
        servers' buffers) priced by ``model``: their time (None where something is not covered:
        added to ``missing``), the devices they run on; with ``out``, the shares of time per
        device and op put in it."""
        t = self.t
        total = 0.0
        dev_ns: dict[str, float] = defaultdict(float)
        op_ns: dict[str, float] = defaultdict(float)
        # (a graph another than the previous compute's is sent whole to an RPC server; the
        # prompt's last compute is the previous of generation's first)
        counts: dict[tuple[int, int, bool], int] = defaultdict(int)
        cells: dict[tuple[int, int, bool], int] = defaultdict(int)  # summed over the computes
        last = computes(t)[0][-1] if kind == "gen" and t.n_prompt > 0 else None
        seen = compute_cells(t)[0 if kind == "prompt" else 1]
        for key, n_cells in zip(plan, seen, strict=True):
            counts[(key[0], key[1], key != last)] += 1
            cells[(key[0], key[1], key != last)] += n_cells
            last = key
        ok = True
        used: set[str] = set()  # the devices this kind's computes run on
        # op classes whose work goes beyond what the logs measured (op_costs.BEYOND)
        beyond: dict[tuple[str, str, str, str], float] = {}
        # at a thread count no log ran, the CPU's time per (what each op is, op) (thread_scale)
        bound: dict[tuple[str, str], float] = {}
        # attention ops on more KV cells than the logs' read (op_costs.KV_EXTRAPOLATION), and
        # what the probe measured of them beyond their anchors (kv_probe)
        deeper: dict[tuple[str, str, str, str], float] = {}
        measured = 0.0
        for (n_tok, kv, resend), count in counts.items():
            gc, devs = self.builder.graph(n_tok, kv)
            used |= {d or "CPU" for d, nop in zip(devs, gc.noop, strict=False) if not nop}
            held = self.builder.holders(n_tok, kv)
            once: dict[tuple[str, str], float] = {}
            mean = cells[(n_tok, kv, resend)] / count  # (flash attention's time is linear in it)
            deep: dict[tuple[str, str, str, str], float] = {}
            cost, extra, miss, lost = model.price_compute(
                gc, devs, t.threads, kind, resend, held, self.proxies, beyond, once, deep, mean
            )
            found = self._probed(model, kind, (n_tok, kv, resend), gc, devs, mean, cost, deep)
            if found is not None:
                cost, over_anchor = found
                measured += count * float(over_anchor.sum())
                for k, c in enumerate(over_anchor):
                    if c:
                        op_ns[gc.labels[k]] += count * c
                        dev_ns[devs[k] if k < len(devs) else "CPU"] += count * c
            else:
                for cls, v in deep.items():
                    deeper[cls] = max(deeper.get(cls, 0.0), v)
            for pair, ns in once.items():
                bound[pair] = bound.get(pair, 0.0) + count * ns
            for line in [_missing_line(m, t) for m in miss] + lost:
                self.missing[line] = None
                ok = False
            over = model.overhead_at(t.threads, kind, t.depth > 0 and first)
            total += count * (float(cost.sum()) + sum(extra.values()) + over)
            for k, c in enumerate(cost):
                if c:
                    dev_ns[devs[k] if k < len(devs) else "CPU"] += count * c
                    op_ns[gc.labels[k]] += count * c
            for d, v in extra.items():
                dev_ns[d] += count * v
        if beyond:
            self.missing[_beyond_line(kind, beyond, t)] = None
            ok = False
        far = max(kv for _n, kv in plan) / model.max_kv if model.max_kv else 1.0
        if deeper and far > KV_EXTRAPOLATION:
            self.missing[_too_deep_line(kind, far, model.max_kv, t)] = None
            ok = False
        elif deeper:
            self.extrapolated[_deeper_line(kind, deeper, far, model.max_kv)] = None
            self.deeper[kind] = True
        if first:
            # the session's first step allocates its compute buffers on the RPC servers
            setup = model.splits.net.setup_ns()
            total += setup
            if setup:
                dev_ns["network"] += setup
        if measured:
            self.measured[kind] = measured
        if not ok or total <= 0:
            return None, frozenset(used)
        if out is not None:
            s_dev = sum(dev_ns.values()) or 1.0
            s_op = sum(op_ns.values()) or 1.0
            out.by_device[kind] = {d: v / s_dev for d, v in sorted(dev_ns.items())}
            out.by_op[kind] = {o: v / s_op for o, v in sorted(op_ns.items(), key=lambda kv: -kv[1])}
            if bound:
                s_b = sum(bound.values()) or 1.0
                shares: dict[str, dict[str, float]] = defaultdict(dict)
                for (what, op), ns in sorted(bound.items(), key=lambda kv: -kv[1]):
                    shares[what][op] = ns / s_b
                out.op_bounds[kind] = dict(shares)
        return total, frozenset(used)

    def _probed(
        self,
        model: CostModel,
        kind: str,
        group: tuple[int, int, bool],
        gc: GraphCosts,
        devs: list[str],
        cells: float,
        cost: np.ndarray,
        deep: dict[tuple[str, str, str, str], float],
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A group of computes whose attention reads more KV cells than the logs' did, priced
        by the probe (``kv_probe``): each node's price at the anchor (the graph at the logs'
        most cells, priced by the model), and each attention op's measured time over it. None
        where there is no probe, nothing beyond the logs, or an attention op the probe cannot
        measure (the line per cell prices the group then, as ``deep`` says)."""
        if self.probe is None or not deep or not model.max_kv:
            return None
        n_tok, kv, resend = group
        pos0 = max(int(round((cells - n_tok * (n_tok + 1) / 2) / n_tok)), 0)
        # the anchor: the same ubatch at the most cells the logs read (or its own, if more)
        pos0_a = max(0, min(pos0, model.max_kv - n_tok))
        if model.flash and any(gc.labels[k] == FLASH for k in np.flatnonzero(gc.kv)):
            # flash attention's time is in the cells its rows see, not the cache's: its anchor
            # sees no more than the logs' computes did (a line carried from a generation's few
            # dozen cells to a prompt's thousands priced a 512-deep prompt 20 % slow)
            seen = min(line.cells_hi for line in model.flash.values())
            pos0_a = min(pos0_a, max(0, int((seen - n_tok * (n_tok + 1) / 2) // n_tok)))
        kv_a = max(model.max_kv, n_kv(pos0_a + n_tok, 1 << 30))
        if kv_a >= kv:
            return None
        gc_a, devs_a = self.builder.graph(n_tok, kv_a)
        if gc_a.labels != gc.labels or gc_a.roles != gc.roles or devs_a != devs:
            return None
        held_a = self.builder.holders(n_tok, kv_a)
        anchor, _e, miss, _l = model.price_compute(
            gc_a, devs_a, self.t.threads, kind, resend, held_a, None, None, None, None,
            float(visible_cells(pos0_a, n_tok)),
        )  # fmt: skip
        if miss:
            return None
        shapes = {
            int(k): attention_shape(gc.graph, int(k), gc.roles[k]) for k in np.flatnonzero(gc.kv)
        }
        if any(v is None for v in shapes.values()) or not shapes:
            return None
        priced = cost.copy()
        over = np.zeros_like(cost)
        for k, sh in shapes.items():
            assert sh is not None
            dev = devs[k] if k < len(devs) else "CPU"
            deep_ns = self.probe.ns(sh, pos0, dev)
            at_ns = self.probe.ns(sh.at(kv_a), pos0_a, dev)
            if deep_ns is None or at_ns is None:
                return None
            priced[k] = anchor[k]
            over[k] = max(deep_ns - at_ns, -anchor[k])
            self.probed[kind][(sh, kv, pos0, dev)] = {
                "op": sh.op, "device": dev, "rows": sh.rows, "n_kv": kv, "pos0": pos0,
                "us_a_layer": deep_ns / 1e3, "anchor_us_a_layer": at_ns / 1e3,
                "anchor_n_kv": kv_a, "anchor_pos0": pos0_a, "anchor_priced_us": anchor[k] / 1e3,
            }  # fmt: skip
        return priced, over


def bounds_line(bounds: dict[str, dict[str, dict[str, float]]], shown: int = 4) -> str:
    """What each op is at the target's thread count, per kind, with its share of the CPU's
    time (``Prediction.op_bounds``; the ``shown`` largest of each)."""
    parts = []
    for kind in ("prompt", "gen"):
        by = bounds.get(kind)
        if not by:
            continue
        what = "; ".join(
            f"{name} " + ", ".join(f"{op} {v:.0%}" for op, v in list(ops.items())[:shown])
            for name, ops in sorted(by.items(), key=lambda kv: -sum(kv[1].values()))
        )
        parts.append(f"{'generation' if kind == 'gen' else 'prompt'}: {what}")
    return "; ".join(parts)


def measuring_run(t: Target) -> str:
    """The ``instr run`` that measures ``t``'s own sizes: its prompt (after its depth, which a
    longer prompt reaches) in its ubatches, and its generation at the KV sizes it reaches."""
    tokens = t.depth + t.n_prompt
    n_ctx = -(-(tokens + t.n_gen + 1) // KV_PAD) * KV_PAD
    args = [f"instr run {t.model} -t {t.threads}"]
    args.append(f"--batch {t.n_batch} --ubatch {t.n_ubatch} --ctx {n_ctx} -n {t.n_gen}")
    if t.offload.gpu_layers:
        args.append(f"-ngl {t.offload.gpu_layers}")
    args += [f"-ot '{x}'" for x in t.tensors.command_line()[1:]]
    args += context_defaults.flash_attn_args(t.flash_attn)
    if (t.type_k, t.type_v) != ("f16", "f16"):
        args.append(f"-ctk {t.type_k} -ctv {t.type_v}")
    args.append(f"--ignore-eos -p <a prompt of {tokens} tokens>")
    return " ".join(args)


def _beyond_line(kind: str, classes: dict[tuple[str, str, str, str], float], t: Target) -> str:
    """What is not covered where a kind's ops go beyond the work the logs measured, and the run
    that measures it."""
    (where, op, typ, tokens), far = max(classes.items(), key=lambda kv: kv[1])
    of = f" of {typ}" if typ else ""
    times = (
        "work where the logs' ops of it did none"
        if far == float("inf")
        else f"{far:.3g}x the most work the logs measured of it"
    )
    name = "the prompt" if kind == "prompt" else "generation"
    # (what comes before the first "; " is the line plan lists once for all its settings)
    return (
        f"{name}'s ops beyond the sizes the logs measured; not extrapolated: {len(classes)} op "
        f"class(es), up to {times} ({op}{of} in ubatches of {tokens} token(s) on {where}); run "
        f"`{measuring_run(t)}` (detailed) and add its log"
    )


def _deeper_line(
    kind: str, classes: dict[tuple[str, str, str, str], float], far: float, max_kv: int
) -> str:
    """What was extrapolated where a kind's attention ops read more KV cells than the logs'."""
    ops = sorted({f"{op} {typ}".strip() for (_w, op, typ, _n) in classes})
    name = "the prompt" if kind == "prompt" else "generation"
    return (
        f"{name}'s attention ({', '.join(ops)}) reads up to {far:.3g}x the {max_kv} KV cells the "
        "logs' computes read: priced by its measured cost per KV cell, an extrapolation "
        f"(bench/predict.py --depth-grid checks it to {KV_EXTRAPOLATION:g}x; beyond, not predicted)"
    )


def _too_deep_line(kind: str, far: float, max_kv: int, t: Target) -> str:
    """What is not covered where a kind's attention goes beyond what the bench checks."""
    name = "the prompt" if kind == "prompt" else "generation"
    return (
        f"{name}'s attention reads {far:.3g}x the {max_kv} KV cells the logs' computes read, "
        f"beyond the {KV_EXTRAPOLATION:g}x its cost per cell is extrapolated to; run "
        f"`{measuring_run(t)}` (detailed) and add its log"
    )


def _missing_line(m: tuple[str, str, str, str], t: Target) -> str:
    where, op, typ, tokens = m
    steps = f"ubatches of {tokens} token(s)"
    of = f" of {typ}" if typ else ""
    return f"{op}{of} in {steps} on {where}: no log has it; {_advice(t, where)}"


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
