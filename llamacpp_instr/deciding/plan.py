"""Which setting to run (``instr plan``): every candidate setting of a model that fits the memory
given, ranked by predicted speed, with the Pareto front of memory and speed marked.

The candidates are the product of the quantizations asked for, the thread counts the logs ran
(another would not be covered), the ubatch sizes (the logs' and 512), the KV cache types ``fit``
tries (f16; q8_0 with flash attention) and, where a GPU exists, no layers or all of them on it.
Each is checked against the memory with ``fit``'s projection (llama.cpp's own, of the model loaded
without weights: the machine's ``Meter``) at the context asked for, and priced by ``predict`` from the
logs' measured ops. A setting that fits but is not covered (flash attention never logged, say)
stays in the list, unranked, with what to run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.deciding import fit
from llamacpp_instr.deciding.measures import Machine, Meter
from llamacpp_instr.deciding.prediction import predict, sampling_price
from llamacpp_instr.deciding.prediction.op_costs import CostModel
from llamacpp_instr.running import context_choices, offload
from llamacpp_instr.running.memory_budget import OutOfMemory
from llamacpp_instr.running.run_config import RunConfig


@dataclass
class Candidate:
    """One setting, what it takes and how fast it is predicted to run."""

    quant: str
    model: Path
    threads: int
    n_ubatch: int
    type_k: str
    type_v: str
    flash_attn: bool | None  # None: llama.cpp's auto
    n_gpu_layers: int
    n_ctx: int
    footprint: fit.Footprint = field(default_factory=dict)
    overflow: list[str] = field(default_factory=list)
    prediction: predict.Prediction | None = None
    # the quantization's mean KL divergence from the base model (a quant-eval report), if given
    kld: float | None = None
    front: bool = False  # on the Pareto front of memory, speed (and quality, where known)

    @property
    def fits(self) -> bool:
        return not self.overflow

    @property
    def bytes(self) -> int:
        return sum(fit.totals(self.footprint).values())

    @property
    def gen(self) -> float | None:
        return self.prediction.covered("gen") if self.prediction else None

    @property
    def prompt(self) -> float | None:
        return self.prediction.covered("prompt") if self.prediction else None

    def run_args(self) -> list[str]:
        """``instr run`` for this setting (its memory options as ``fit`` gives them)."""
        setting = fit.Setting(
            self.n_ctx, self.n_gpu_layers, self.type_k, self.type_v, self.flash_attn
        )
        head = ["instr", "run", str(self.model), "-t", str(self.threads)]
        return head + setting.run_args(bool(self.n_gpu_layers)) + ["--ubatch", str(self.n_ubatch)]

    def to_json(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "quant": self.quant,
            "model": str(self.model),
            "threads": self.threads,
            "n_ubatch": self.n_ubatch,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "flash_attn": context_choices.flash_attn_name(self.flash_attn),
            "n_gpu_layers": self.n_gpu_layers,
            "n_ctx": self.n_ctx,
            "fits": self.fits,
            "overflow": self.overflow,
            "bytes": self.bytes,
            "footprint": self.footprint,
            "gen_tokens_per_s": p.gen.to_json() if p and p.gen else None,
            "prompt_tokens_per_s": p.prompt.to_json() if p and p.prompt else None,
            "not_covered": p.not_covered if p else [],
            "contended": p.contended if p else [],  # logs from a busy machine (predict)
            "kld_mean": self.kld,
            "pareto_front": self.front,
            "command": " ".join(self.run_args()),
        }


def candidates(
    files: list[tuple[str, Path]],
    sessions: list[SessionFrames],
    n_ctx: int,
    gpu: bool,
    n_layer_max: int = 10**6,
) -> list[Candidate]:
    """The settings to try (module docstring)."""
    threads = sorted({int((s.info.context or {}).get("n_threads") or 1) for s in sessions})
    ubatches = sorted(
        {int((s.info.context or {}).get("n_ubatch") or 512) for s in sessions} | {512}
    )
    layers = [0, n_layer_max] if gpu else [0]
    out = []
    for (quant, path), t, ub, kv, ngl in product(files, threads, ubatches, fit.FIT_KV, layers):
        out.append(
            Candidate(
                quant=quant,
                model=path,
                threads=t,
                n_ubatch=min(ub, n_ctx),
                type_k=kv[0],
                type_v=kv[1],
                flash_attn=kv[2],
                n_gpu_layers=ngl,
                n_ctx=n_ctx,
            )
        )
    return out


def measure_memory(
    machine: Machine, cands: list[Candidate], limits: dict[str, int], base: offload.Offload
) -> None:
    """Each candidate's footprint (``fit``'s projection plus the output buffer) and the devices it
    overflows."""
    probers: dict[tuple[Path, int], Meter] = {}
    try:
        for c in cands:
            key = (c.model, c.n_gpu_layers)
            if key not in probers:
                probers[key] = machine.meter(c.model, fit.placed_at(base, c.n_gpu_layers))
            cfg = RunConfig(
                model=c.model,
                prompt="",
                n_ctx=c.n_ctx,
                n_batch=max(512, c.n_ubatch),
                n_ubatch=c.n_ubatch,
                threads=c.threads,
                flash_attn=c.flash_attn,
                type_k=c.type_k,
                type_v=c.type_v,
            )
            pr = probers[key]
            c.footprint = fit.merge(pr.footprint(cfg), pr.unlisted(cfg))
            c.overflow = fit.overflows(c.footprint, limits)
    finally:
        for p in probers.values():
            p.close()


def price(
    cands: list[Candidate],
    model: CostModel,
    sessions: list[SessionFrames],
    base: predict.Target,
    logs: list[str],
    machine: Machine,
) -> None:
    """Each fitting candidate's predicted speed (``predict.price``)."""
    from dataclasses import replace

    for c in cands:
        if not c.fits:
            continue
        t = replace(
            base,
            model=c.model,
            threads=c.threads,
            n_ubatch=c.n_ubatch,
            n_batch=max(base.n_batch, c.n_ubatch),
            flash_attn=c.flash_attn,
            type_k=c.type_k,
            type_v=c.type_v,
        )
        c.prediction = predict.price(t, model, sessions, logs, machine)


def quality(
    report: dict[str, Any], file_type: Callable[[Path], str]
) -> dict[tuple[str, str, str], float]:
    """A quant-eval report (``instr quant-eval --format json``): each model's mean KL divergence
    from the base, by its quantization (the GGUF's own file type; the base's is 0) and the KV
    cache it was evaluated with (type_k, type_v: f16 where the report does not say, the base's)."""
    out: dict[tuple[str, str, str], float] = {}
    base = report.get("base")
    base_path = base.get("path") if isinstance(base, dict) else None
    rows: list[tuple[Any, str, str, float]] = [(base_path, "f16", "f16", 0.0)]
    models = report.get("models")
    for m in models if isinstance(models, list) else []:
        kld = m.get("kld") if isinstance(m, dict) else None
        if isinstance(kld, dict) and isinstance(kld.get("mean"), (int, float)):
            kv = (str(m.get("type_k") or "f16"), str(m.get("type_v") or "f16"))
            rows.append((m.get("path"), *kv, float(kld["mean"])))
    for path, type_k, type_v, value in rows:
        if isinstance(path, str) and path and Path(path).is_file():
            out.setdefault((file_type(Path(path)), type_k, type_v), value)
    return out


def mark_front(cands: list[Candidate]) -> None:
    """The Pareto front of the fitting, covered candidates: none other takes no more memory, runs
    generation and prompt no slower and diverges no more from the base, and is better in one of
    them. The divergence (a quant-eval report's, of the quantization with the setting's KV cache)
    is compared where both settings have one; a setting with one and a setting without are not
    compared (neither can beat the other: what the unmeasured one loses is not known)."""
    ranked = [c for c in cands if c.fits and c.gen is not None and c.prompt is not None]

    def key(c: Candidate) -> tuple[float, ...]:
        k = (-float(c.bytes), c.gen or 0.0, c.prompt or 0.0)
        return k if c.kld is None else k + (-c.kld,)

    for c in ranked:
        kc = key(c)
        c.front = not any(
            o is not c
            and (o.kld is None) == (c.kld is None)
            and all(a >= b for a, b in zip(key(o), kc, strict=True))
            and key(o) != kc
            for o in ranked
        )


def unmeasured_quality(cands: list[Candidate], base: str) -> list[str]:
    """Where some settings have a quality and others not: the quant-eval run against ``base``
    (the reports' base model) that measures each missing quantization and KV cache, once each."""
    ranked = [c for c in cands if c.fits and c.gen is not None]
    if not any(c.kld is not None for c in ranked):
        return []
    out: dict[str, None] = {}
    for c in ranked:
        if c.kld is None:
            quant = "" if str(c.model) == base else f" {c.model}"
            f16 = (c.type_k, c.type_v) == ("f16", "f16")
            kv = "" if f16 else f" -ctk {c.type_k} -ctv {c.type_v}"
            fa = "".join(f" {a}" for a in context_choices.flash_attn_args(c.flash_attn))
            out[
                f"{c.quant} with a {c.type_k}/{c.type_v} KV cache: `instr quant-eval {base}{quant}"
                f"{kv}{fa} --format json`, given with --quality"
            ] = None
    return list(out)


def rank(cands: list[Candidate]) -> list[Candidate]:
    """Fitting and covered first, fastest generation first (then prompt); then fitting but not
    covered; then what does not fit."""

    def key(c: Candidate) -> tuple[int, float, float]:
        group = 0 if c.fits and c.gen is not None else 1 if c.fits else 2
        return (group, -(c.gen or 0.0), -(c.prompt or 0.0))

    return sorted(cands, key=key)


@dataclass(frozen=True)
class PlanRequest:
    """The settings of ``model`` to rank by the speed ``logs`` (detailed logs of runs of it)
    predict: each of ``quants`` (default: the file's own), holding ``n_ctx`` tokens of context in
    ``memory`` as --memory takes it (DEVICE=SIZE; each device's free memory otherwise), with all
    layers offloaded too where ``offload`` names a GPU; ``quality``: quant-eval JSON reports whose
    KL divergences join the Pareto front."""

    model: Path
    logs: tuple[Path, ...]
    memory: tuple[str, ...] = ()
    n_ctx: int = 2048
    quants: tuple[str, ...] = ()
    quality: tuple[Path, ...] = ()
    offload: offload.Offload = field(default_factory=offload.Offload)


@dataclass
class PlanResult:
    """The candidates ranked (``rank``) and what they were ranked against."""

    ranked: list[Candidate]
    limits: dict[str, int]  # what each device may hold
    n_ctx: int
    # the logs' speculation (``spec_predict.run_sessions``), or None where no log speculated
    speculation: dict[str, Any] | None = None
    unmeasured: list[str] = field(default_factory=list)  # ``unmeasured_quality``
    # a generated token's sampling as the logs measured it (the same for every setting)
    sampling: sampling_price.SamplingPrice | None = None

    def to_json(self) -> list[dict[str, Any]]:
        docs = [c.to_json() for c in self.ranked]
        spec = self.speculation
        sampling = self.sampling.at() if self.sampling is not None else None
        for c, d in zip(self.ranked, docs, strict=True):
            d["sampling"] = sampling
            # the speculation the logs measured, on the settings at their thread count
            d["speculation"] = spec if spec and c.threads in spec["threads"] else None
        return docs

    def failure(self) -> UserError | None:
        """Nothing fits: out of memory, exit status 3 (as instr fit; bad input is 2)."""
        if any(c.fits for c in self.ranked):
            return None
        over = sorted({d for c in self.ranked for d in c.overflow})
        return OutOfMemory(f"nothing fits: every setting overflows {', '.join(over)}")


def plan(
    request: PlanRequest, machine: Machine, say: Callable[[str], None] = lambda _: None
) -> PlanResult:
    """``instr plan``: every candidate's memory and predicted speed on ``machine``, the quality
    reports' KL divergences, the Pareto front, ranked. ``say`` hears the quantizer's progress."""
    from llamacpp_instr.native import models

    models.check_gguf(request.model)
    if not request.logs:
        raise UserError("give at least one detailed log of a run of this model to rank by speed")
    reports = [quality_report(path) for path in request.quality]
    machine.load(quiet=True)  # (llama.cpp's lines per context made)
    o = request.offload
    names = machine.devices(o.rpc)
    limits = {**machine.free_memory(), **fit.parse_memory(request.memory, names)}
    logs = list(request.logs)
    sessions = predict.load_logs(logs)
    base = predict.default_target(sessions[0], request.model)
    files = machine.quantized(request.model, request.quants, say)
    gpu = bool(o.gpu_layers) or bool(o.devices) or bool(o.rpc)
    cands = candidates(files, sessions, request.n_ctx, gpu)
    measure_memory(machine, cands, limits, o)
    names = [str(p) for p in logs]
    price(cands, predict.fit(sessions, machine=machine), sessions, base, names, machine)
    kld: dict[tuple[str, str, str], float] = {}
    for report in reports:
        kld = {
            **quality(report, machine.file_type),
            **kld,
        }  # the first report given of a setting counts
    for c in cands:
        c.kld = kld.get((c.quant, c.type_k, c.type_v))
    mark_front(cands)
    base_of = reports[0].get("base") if reports else None
    unmeasured = unmeasured_quality(
        cands, str(base_of.get("path")) if isinstance(base_of, dict) else "BASE.gguf"
    )
    return PlanResult(
        rank(cands),
        limits,
        request.n_ctx,
        speculation(logs, sessions),
        unmeasured,
        sampling_price.measure(sessions),
    )


def quality_report(path: Path) -> dict[str, Any]:
    """A quant-eval JSON report read, or a one-line UserError."""
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a quant-eval JSON report ({exc})") from None
    if not isinstance(report, dict) or "models" not in report:
        raise UserError(f"{path}: not a quant-eval JSON report (no models)")
    return report


def speculation(logs: list[Path], sessions: list[SessionFrames]) -> dict[str, Any] | None:
    """The logs' speculation (llama-server's, with a draft or n-grams): its prediction at every
    draft length (``spec_predict``), or None where no log speculated."""
    from llamacpp_instr.deciding.prediction import spec_predict

    named = [(str(p), f) for p, f in zip(logs, sessions, strict=True) if f.info.verifies]
    if not named:
        return None
    try:
        longest = max(spec_predict.n_max_of(f) for _, f in named)
        return spec_predict.run_sessions(named, longest)
    except UserError:
        return None
