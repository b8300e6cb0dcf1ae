"""The setting ``predict`` prices (``Target``: what ``instr run`` would be given, by default a
log's own) and what its prediction holds (``Prediction``), with the computes the run would make:
its prompt's ubatches, then one per generated token, each at the KV size and the cells it sees."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.frames import SessionFrames, load_session
from llamacpp_instr.deciding.prediction.intervals import Interval
from llamacpp_instr.deciding.prediction.kv_costs import KV_PAD, n_kv, visible_cells
from llamacpp_instr.running import offload
from llamacpp_instr.running.tensor_overrides import TensorOverrides


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
