"""Where a mixture of experts' expert weights go: the placements of the expert tensors between the
GPU and the host that fit the memory, ranked by predicted speed (``instr plan --experts``,
``instr fit --experts``).

The other layers go where -ngl puts them (all, by default); the candidates are llama.cpp's
``--n-cpu-moe N`` for each N (the experts of the first N layers on the CPU) and, per count, the
layers whose experts are cheapest to keep on the CPU as an ``-ot`` rule (``blk\\.(3|5)\\.ffn_...
_exps=CPU``). Which layers are cheapest: each layer alone on the CPU is priced, and the layers are
taken in the order of the time they add per byte they free (generation first, then the prompt).
With layers alike the order is theirs, and every such set is an ``--n-cpu-moe``; layers differ
where the logs' routing does (the share of a layer's experts its prompt ubatches touched: what
ggml copies to run its expert matmuls on the GPU) or their weights do.

Each candidate's memory is llama.cpp's own projection of the model loaded with its rules (``fit``'s,
the machine's ``Meter``), and its speed ``predict``'s, from the logs' measured ops, copies and expert traffic
(``expert_traffic``), the graphs built by llama.cpp with its rules. Each comes with its command
line, the ``-ot`` rule included (for an ``--n-cpu-moe`` too, as llama.cpp's ``-ot`` would say it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.deciding import fit
from llamacpp_instr.deciding.measures import Machine
from llamacpp_instr.deciding.prediction import predict
from llamacpp_instr.deciding.prediction.op_costs import CostModel
from llamacpp_instr.running import context_choices, offload
from llamacpp_instr.running.memory_budget import OutOfMemory
from llamacpp_instr.running.run_config import RunConfig
from llamacpp_instr.running.tensor_overrides import CPU, EXPS_REGEX, TensorOverrides


def ot_rule(layers: tuple[int, ...]) -> str:
    """The -ot value that keeps the experts of ``layers`` on the CPU."""
    alt = layers[0] if len(layers) == 1 else "(" + "|".join(map(str, layers)) + ")"
    return rf"blk\.{alt}{EXPS_REGEX}={CPU}"


@dataclass(frozen=True)
class ExpertPlacement:
    """The layers whose expert tensors stay in host memory (sorted)."""

    cpu: tuple[int, ...]

    @property
    def n_cpu_moe(self) -> int | None:
        """N where the layers are llama.cpp's --n-cpu-moe N (the first N)."""
        return len(self.cpu) if self.cpu == tuple(range(len(self.cpu))) else None

    def tensors(self) -> TensorOverrides:
        if self.n_cpu_moe is not None:
            return TensorOverrides.from_options(n_cpu_moe=self.n_cpu_moe or None)
        return TensorOverrides.from_options([ot_rule(self.cpu)])

    def ot(self) -> str | None:
        """The -ot value of this placement (for --n-cpu-moe N too); None for no layer."""
        return ot_rule(self.cpu) if self.cpu else None

    def args(self) -> list[str]:
        if self.n_cpu_moe is not None:
            return ["--n-cpu-moe", str(self.n_cpu_moe)]
        return ["-ot", f"'{self.ot()}'"]

    def label(self) -> str:
        if not self.cpu:
            return "none"
        if self.n_cpu_moe is not None:
            return f"--n-cpu-moe {self.n_cpu_moe}"
        return "layers " + ",".join(map(str, self.cpu))


@dataclass
class PlacementCandidate:
    placement: ExpertPlacement
    expert_bytes_cpu: int  # the expert weights it keeps in host memory
    footprint: fit.Footprint = field(default_factory=dict)
    overflow: list[str] = field(default_factory=list)
    prediction: predict.Prediction | None = None

    @property
    def fits(self) -> bool:
        return not self.overflow

    @property
    def gen(self) -> float | None:
        return self.prediction.covered("gen") if self.prediction else None

    @property
    def prompt(self) -> float | None:
        return self.prediction.covered("prompt") if self.prediction else None

    def command(self, t: predict.Target, n_ctx: int) -> str:
        ngl = t.offload.gpu_layers
        head = f"instr run {t.model} -t {t.threads} --ctx {n_ctx} -ngl {ngl}"
        head += "".join(f" {a}" for a in context_choices.flash_attn_args(t.flash_attn))
        if (t.type_k, t.type_v) != ("f16", "f16"):
            head += f" -ctk {t.type_k} -ctv {t.type_v}"
        return " ".join([head, *self.placement.args()])

    def to_json(self, t: predict.Target, n_ctx: int) -> dict[str, Any]:
        p = self.prediction
        return {
            "placement": self.placement.label(),
            "cpu_layers": list(self.placement.cpu),
            "n_cpu_moe": self.placement.n_cpu_moe,
            "ot": self.placement.ot(),
            "expert_bytes_cpu": self.expert_bytes_cpu,
            "fits": self.fits,
            "overflow": self.overflow,
            "footprint": self.footprint,
            "gen_tokens_per_s": p.gen.to_json() if p and p.gen else None,
            "prompt_tokens_per_s": p.prompt.to_json() if p and p.prompt else None,
            "not_covered": p.not_covered if p else [],
            "command": self.command(t, n_ctx),
        }


def expert_layers(sf: SessionFrames) -> dict[int, int]:
    """Each layer's expert weights (bytes), from a log's weight inventory: a one-line UserError
    for a model whose experts the log does not name (llama.cpp's ``ffn_*_exps`` tensors)."""
    from llamacpp_instr.converters.reports.memory_report import expert_tensors

    out: dict[int, int] = {}
    for t in expert_tensors(sf):
        if isinstance(t["layer"], int):
            out[t["layer"]] = out.get(t["layer"], 0) + int(t["bytes"])
    if not out:
        arch = (sf.info.model or {}).get("architecture", "?")
        raise UserError(
            f"the log's model ({arch}) has no expert tensors llama.cpp's -ot/--n-cpu-moe place "
            "(blk.N.ffn_{up,down,gate}_exps): no expert placement to rank"
        )
    return out


class Planner:
    """The candidates of one model and setting: their memory and predicted speed."""

    def __init__(
        self,
        target: predict.Target,
        sessions: list[SessionFrames],
        logs: list[str],
        machine: Machine,
        model: CostModel | None = None,
    ) -> None:
        self.target = target
        self.sessions = sessions
        self.logs = logs
        self.machine = machine
        self.model = model if model is not None else predict.fit(sessions, machine=machine)
        self.layers = expert_layers(sessions[0])
        self.priced: dict[ExpertPlacement, predict.Prediction] = {}

    def price(self, p: ExpertPlacement) -> predict.Prediction:
        if p not in self.priced:
            t = replace(self.target, tensors=p.tensors())
            self.priced[p] = predict.price(t, self.model, self.sessions, self.logs, self.machine)
        return self.priced[p]

    def order(self) -> list[int] | None:
        """The layers, cheapest to keep on the CPU first (module docstring); None where a
        single layer's placement is not covered by the logs."""
        none = self.price(ExpertPlacement(()))
        if none.gen is None or none.not_covered:
            return None
        keys = []
        total = sum(self.layers.values())
        for layer, n_bytes in self.layers.items():
            p = self.price(ExpertPlacement((layer,)))
            if p.gen is None or p.not_covered:
                return None
            # the time a token takes more, as a share of its time with every expert on the GPU,
            # per share of the expert weights freed
            per = total / n_bytes
            gen = (none.gen.value / p.gen.value - 1) * per
            prompt = none.prompt.value / p.prompt.value - 1 if p.prompt and none.prompt else 0.0
            # (to a thousandth: prices alike up to their sums' last bits are a tie)
            keys.append((round(gen, 3), round(prompt * per, 3), layer))
        return [layer for *_, layer in sorted(keys)]

    def placements(self, per_layer: bool = True) -> list[ExpertPlacement]:
        """--n-cpu-moe N for each N, then the per-layer sets that are not one of those."""
        layers = sorted(self.layers)
        out = [ExpertPlacement(tuple(range(n))) for n in range(len(layers) + 1)]
        if layers != list(range(len(layers))):  # experts in some layers only: name them
            out = [ExpertPlacement(tuple(layers[:n])) for n in range(len(layers) + 1)]
        order = self.order() if per_layer and len(layers) > 1 else None
        for k in range(1, len(layers)):
            if order is not None:
                p = ExpertPlacement(tuple(sorted(order[:k])))
                if p not in out:
                    out.append(p)
        return out

    def measure(self, cands: list[PlacementCandidate], n_ctx: int, limits: dict[str, int]) -> None:
        """Each candidate's footprint (llama.cpp's projection with its rules) and overflow."""
        t = self.target
        cfg = RunConfig(
            model=t.model,
            prompt="",
            n_ctx=n_ctx,
            n_batch=max(t.n_batch, t.n_ubatch),
            n_ubatch=t.n_ubatch,
            threads=t.threads,
            flash_attn=t.flash_attn,
            type_k=t.type_k,
            type_v=t.type_v,
        )
        for c in cands:
            pr = self.machine.meter(t.model, t.offload, c.placement.tensors())
            try:
                c.footprint = fit.merge(pr.footprint(cfg), pr.unlisted(cfg))
            finally:
                pr.close()
            c.overflow = fit.overflows(c.footprint, limits)

    def candidates(
        self, n_ctx: int, limits: dict[str, int], per_layer: bool = True
    ) -> list[PlacementCandidate]:
        """Every placement with its memory and, where it fits, its predicted speed, ranked
        (``rank``)."""
        cands = [
            PlacementCandidate(p, sum(self.layers.get(la, 0) for la in p.cpu))
            for p in self.placements(per_layer)
        ]
        self.measure(cands, n_ctx, limits)
        for c in cands:
            if c.fits:
                c.prediction = self.price(c.placement)
        return rank(cands)


def rank(cands: list[PlacementCandidate]) -> list[PlacementCandidate]:
    """Fitting and covered first, fastest generation first (then prompt); then fitting but not
    priced (fewest experts on the CPU first); then what does not fit."""

    def key(c: PlacementCandidate) -> tuple[int, float, float, int]:
        group = 0 if c.fits and c.gen is not None else 1 if c.fits else 2
        return (group, -_close(c.gen or 0.0), -_close(c.prompt or 0.0), c.expert_bytes_cpu)

    return sorted(cands, key=key)


def _close(v: float) -> float:
    """``v`` to 4 significant digits: prices alike up to their sums' last bits compare equal."""
    return float(f"{v:.4g}")


def base_target(sessions: list[SessionFrames], model: Path, o: offload.Offload) -> predict.Target:
    """The first log's setting on ``model``, its layers placed by ``o`` (all offloaded where it
    names none)."""
    t = predict.default_target(sessions[0], model)
    layers = o.gpu_layers or t.offload.gpu_layers or offload.ALL
    placed = replace(o, gpu_layers=layers)
    return replace(t, offload=placed, tensors=TensorOverrides())


@dataclass(frozen=True)
class PlacementRequest:
    """Where the expert weights of ``model`` (default: the bundled model) go: every placement
    priced from ``logs`` (detailed logs of runs of it), at the context ``n_ctx`` (default: the
    first log's), in ``memory`` as --memory takes it (DEVICE=SIZE; each device's free memory
    otherwise), the other layers where ``offload`` puts them (all, by default)."""

    model: Path | None
    logs: tuple[Path, ...]
    memory: tuple[str, ...] = ()
    n_ctx: int | None = None
    offload: offload.Offload = field(default_factory=offload.Offload)


@dataclass
class PlacementResult:
    """The placements ranked (``rank``), with what they were ranked against."""

    ranked: list[PlacementCandidate]
    target: predict.Target  # the first log's setting, the experts' placement aside
    n_ctx: int
    limits: dict[str, int]  # what each device may hold
    layers: dict[int, int]  # each layer's expert weights (bytes)

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json(self.target, self.n_ctx) for c in self.ranked]

    def failure(self) -> UserError | None:
        """No placement fits: out of memory, exit status 3."""
        if any(c.fits for c in self.ranked):
            return None
        over = ", ".join(sorted({d for c in self.ranked for d in c.overflow}))
        return OutOfMemory(f"no expert placement fits: every one overflows {over}")


def moe_plan(request: PlacementRequest, machine: Machine) -> PlacementResult:
    """``instr plan --experts`` and ``instr fit --experts``: every placement with its memory and
    predicted speed on ``machine``, ranked."""
    from llamacpp_instr.native import models

    if not request.logs:
        raise UserError("--experts ranks by speed: give a detailed log of a run of this model")
    model = request.model if request.model is not None else models.default_model()
    models.check_gguf(model)
    machine.load(quiet=True)  # (llama.cpp's lines per context made)
    names = machine.devices(request.offload.rpc)
    limits = {**machine.free_memory(), **fit.parse_memory(request.memory, names)}
    sessions = predict.load_logs(list(request.logs))
    t = base_target(sessions, model, request.offload)
    ctx = request.n_ctx or int((sessions[0].info.context or {}).get("n_ctx") or 4096)
    planner = Planner(t, sessions, [str(p) for p in request.logs], machine)
    return PlacementResult(planner.candidates(ctx, limits), t, ctx, limits, planner.layers)
