"""What fits (``instr fit``): the largest context, the most offloaded layers and the KV cache type
that fit each device's memory, and the whole footprint per device and purpose at that setting.

It knows by asking llama.cpp, as llama.cpp's own fit does (the pin's common/fit.cpp), through the
machine its caller hands in (``measures.Machine``; ``running.footprint`` takes the measures): the
model loaded with ``no_alloc`` and no weights read, a context made with the candidate's
parameters, and what each buffer type would take by ``llama_get_memory_breakdown``, with the
output buffer the breakdown leaves out. There is no formula here; the search is this module's.

A multimodal projector (``--mmproj``) counts with its weights and compute buffers on the device its
encoder runs on, by llama.cpp's own measure of it (``running.projector_memory``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.deciding.measures import Footprint, Machine, Meter, Projector
from llamacpp_instr.native import models
from llamacpp_instr.running import context_choices, offload
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.run_config import MediaInputs, RunConfig

# the KV caches fit tries, in order: f16 with llama.cpp's default flash attention (auto), then
# q8_0 (a quantized V cache needs flash attention)
FIT_KV: tuple[tuple[str, str, bool | None], ...] = (("f16", "f16", None), ("q8_0", "q8_0", True))
# contexts are tried in steps of this many cells (llama.cpp pads a KV cache to 256)
CTX_STEP = 256


@dataclass(frozen=True)
class Setting:
    """One candidate: what ``instr run`` would be given."""

    n_ctx: int
    n_gpu_layers: int
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool | None = None  # None: llama.cpp's auto

    def run_args(self, gpu: bool) -> list[str]:
        """The ``instr run`` options of this setting."""
        args = ["--ctx", str(self.n_ctx)]
        if gpu:
            args += ["-ngl", str(self.n_gpu_layers)]
        if self.type_k != "f16" or self.type_v != "f16":
            args += ["-ctk", self.type_k, "-ctv", self.type_v]
        return args + context_choices.flash_attn_args(self.flash_attn)


@dataclass
class Answer:
    """What fits one model file (one quantization)."""

    model: Path
    quant: str
    memory: dict[str, int]  # the bytes each device may hold
    n_ctx_train: int
    n_layer: int
    gpu: bool  # whether a GPU device exists (else -ngl is not searched)
    setting: Setting | None = None  # None: not even the smallest context fits
    footprint: Footprint = field(default_factory=dict)
    # why nothing fits: the smallest setting's footprint, and the devices it overflows
    overflow: list[str] = field(default_factory=list)
    llama_fit: dict[str, dict[str, int]] | None = None  # llama-fit-params' projection (MiB)
    measured: Footprint | None = None  # a real run's live buffers
    mmproj: Path | None = None  # the projector counted in the footprint (--mmproj)
    mmproj_offload: bool = True  # counted where a GPU may hold it (off: --no-mmproj-offload)

    def media(self) -> MediaInputs:
        """The projector as the answer counted it, for a run of the answer."""
        return MediaInputs(mmproj=self.mmproj, offload=self.mmproj_offload)

    def to_json(self) -> dict[str, Any]:
        s = self.setting
        out: dict[str, Any] = {
            "model": str(self.model),
            "quant": self.quant,
            "fits": s is not None,
            "n_ctx": s.n_ctx if s else None,
            "n_gpu_layers": s.n_gpu_layers if s else None,
            "type_k": s.type_k if s else None,
            "type_v": s.type_v if s else None,
            "flash_attn": context_choices.flash_attn_name(s.flash_attn) if s else None,
            "footprint": self.footprint,
            "memory": self.memory,
            "n_ctx_train": self.n_ctx_train,
        }
        if self.overflow:
            out["overflow"] = self.overflow
        if self.llama_fit is not None:
            out["llama_fit_params"] = self.llama_fit
        if self.measured is not None:
            out["measured"] = self.measured
        if self.mmproj is not None:
            out["mmproj"] = str(self.mmproj)
            out["mmproj_offload"] = self.mmproj_offload
        return out


def parse_memory(specs: tuple[str, ...], devices: list[str]) -> dict[str, int]:
    """--memory DEVICE=SIZE (repeatable, or comma-separated) -> {device: bytes}, each device one
    of ``devices`` (ggml's, ``Machine.devices``: case-insensitive, named as ggml names it); a
    one-line UserError otherwise."""
    if not specs:
        return {}
    asked = memory.parse_budget(",".join(specs))
    names = {d.lower(): d for d in devices}
    out: dict[str, int] = {}
    for dev, size in asked.items():
        if dev.lower() not in names:
            raise UserError(
                f"unknown device {dev!r} for --memory: the devices are {', '.join(names.values())}"
            )
        out[names[dev.lower()]] = size
    return out


def merge(a: Footprint, b: Footprint) -> Footprint:
    out = {dev: dict(p) for dev, p in a.items()}
    for dev, purposes in b.items():
        for purpose, n in purposes.items():
            out.setdefault(dev, {})[purpose] = out.get(dev, {}).get(purpose, 0) + n
    return out


def totals(fp: Footprint) -> dict[str, int]:
    return {dev: sum(p.values()) for dev, p in fp.items()}


def overflows(fp: Footprint, limits: dict[str, int]) -> list[str]:
    """The devices whose share of ``fp`` is more than they may hold."""
    return [dev for dev, n in totals(fp).items() if dev in limits and n > limits[dev]]


@dataclass
class FitConfig:
    """What ``instr fit`` was asked."""

    model: Path
    memory: dict[str, int] = field(default_factory=dict)  # --memory; the rest: free memory
    n_ctx: int | None = None  # the largest context considered (default: n_ctx_train)
    gpu_layers: int | None = None  # a fixed -ngl (default: searched when a GPU exists)
    # --device, --rpc, --tensor-split (its gpu_layers is the one probed, not this one's)
    offload: offload.Offload = field(default_factory=offload.Offload)
    n_batch: int = 512
    n_ubatch: int | None = None
    threads: int | None = None
    projector: Projector | None = None  # --mmproj: its weights and compute buffers counted

    def run_config(self, path: Path, s: Setting) -> RunConfig:
        """What ``instr run`` is given for ``s`` on ``path``."""
        return RunConfig(
            model=path, prompt="", n_ctx=s.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
            threads=self.threads, flash_attn=s.flash_attn, type_k=s.type_k, type_v=s.type_v,
            offload=replace(self.offload, gpu_layers=s.n_gpu_layers),
        )  # fmt: skip


def placed_at(base: offload.Offload, ngl: int) -> offload.Offload:
    """``base`` at ``ngl`` layers offloaded; none: the CPU alone (and no warning that the devices
    go unused)."""
    return replace(base, gpu_layers=ngl) if ngl else offload.Offload(repack=base.repack)


class Search:
    """One model file's search (``fit_model``): its meters, one per -ngl, and the contexts tried."""

    def __init__(self, machine: Machine, path: Path, fc: FitConfig, limits: dict[str, int]) -> None:
        self.machine, self.path, self.fc, self.limits = machine, path, fc, limits
        self.meters: dict[int, Meter] = {}
        self.ctxs: list[int] = []
        self.extra: Footprint = {}

    def meter(self, ngl: int) -> Meter:
        if ngl not in self.meters:
            self.meters[ngl] = self.machine.meter(self.path, placed_at(self.fc.offload, ngl))
        return self.meters[ngl]

    def start(self, first: int) -> tuple[int, int]:
        """The model's layers and trained context, read at ``first`` layers offloaded; the
        contexts to try (up to the cap) and the output buffer measured at the smallest."""
        m = self.meter(first)
        fc, n_train = self.fc, m.n_ctx_train
        cap = min(fc.n_ctx or n_train, n_train) if n_train > 0 else fc.n_ctx or 4096
        self.ctxs = list(range(CTX_STEP, cap + 1, CTX_STEP)) or [cap]
        self.extra = m.unlisted(fc.run_config(self.path, Setting(self.ctxs[0], 0)))
        return m.n_layer, n_train

    def project(self, s: Setting) -> Footprint:
        cfg = self.fc.run_config(self.path, s)
        fp = merge(self.meter(s.n_gpu_layers).footprint(cfg), self.extra)
        projector = self.fc.projector
        return merge(fp, projector.footprint(s.flash_attn)) if projector else fp

    def fits(self, ngl: int, kv: tuple[str, str, bool | None]) -> bool:
        """Whether the whole context fits at ``ngl`` and ``kv``."""
        return not overflows(self.project(Setting(self.ctxs[-1], ngl, *kv)), self.limits)

    def largest_ctx(self, ngl: int, kv: tuple[str, str, bool | None]) -> Setting | None:
        """The largest context that fits at ``ngl`` and ``kv`` (binary search: the footprint
        grows with the context)."""
        lo, hi, best = 0, len(self.ctxs) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            s = Setting(self.ctxs[mid], ngl, *kv)
            if overflows(self.project(s), self.limits):
                hi = mid - 1
            else:
                best, lo = s, mid + 1
        return best

    def most_layers(self, counts: list[int], kv: tuple[str, str, bool | None]) -> Setting | None:
        """The whole context with the most layers offloaded, or the largest context.

        A GPU's share grows with the layers and the CPU's shrinks, so the layer counts at which
        the whole context fits are one run: from 0 when the GPU limits, up to all when the CPU
        does (a binary search finds its end). When neither end fits, every count is tried for
        its largest context."""
        lo, hi = counts[0], counts[-1]
        if self.fits(hi, kv):
            return Setting(self.ctxs[-1], hi, *kv)
        if lo < hi and self.fits(lo, kv):
            while hi - lo > 1:  # fits(lo), not fits(hi)
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self.fits(mid, kv) else (lo, mid)
            return Setting(self.ctxs[-1], lo, *kv)
        best = [s for ngl in reversed(counts) if (s := self.largest_ctx(ngl, kv))]
        return max(best, key=lambda s: (s.n_ctx, s.n_gpu_layers)) if best else None

    def best(self, counts: list[int]) -> Setting | None:
        """The largest context, then the most layers; at equal ones the f16 cache (the first)."""
        found: list[Setting] = []
        for kv in FIT_KV:
            s = self.most_layers(counts, kv)
            if s is not None:
                found.append(s)
                if s.n_ctx == self.ctxs[-1]:
                    break  # the whole context fits: a q8_0 cache would only lose precision
        if not found:
            return None
        return max(found, key=lambda s: (s.n_ctx, s.n_gpu_layers, -found.index(s)))

    def close(self) -> None:
        for m in self.meters.values():
            m.close()


def fit_model(machine: Machine, path: Path, quant: str, fc: FitConfig) -> Answer:
    """The largest context (a multiple of 256 up to the cap), then the most layers offloaded
    (searched only when a GPU exists and -ngl was not given), then an f16 before a q8_0 KV
    cache, that fit every device's memory."""
    machine.load(quiet=True)  # (llama.cpp's lines per tensor and per reservation)
    limits = {**machine.free_memory(), **fc.memory}
    # a device to offload to (RPC servers are GPUs to llama.cpp)
    gpu = bool(machine.offload_devices(fc.offload))
    search = Search(machine, path, fc, limits)
    try:
        n_layer, n_ctx_train = search.start(0 if not gpu else (fc.gpu_layers or 0))
        answer = Answer(path, quant, limits, n_ctx_train, n_layer, gpu)
        if fc.projector is not None:
            answer.mmproj, answer.mmproj_offload = fc.projector.path, fc.projector.offload
        if not gpu:
            counts = [0]
        elif fc.gpu_layers is not None:
            counts = [min(fc.gpu_layers, n_layer + 1)]
        else:
            counts = list(range(n_layer + 2))  # n_layer + 1: the output layer too
        answer.setting = search.best(counts)
        if answer.setting is not None:
            answer.footprint = search.project(answer.setting)
        else:
            smallest = Setting(search.ctxs[0], counts[-1], *FIT_KV[-1])
            answer.footprint = search.project(smallest)
            answer.overflow = overflows(answer.footprint, limits)
        return answer
    finally:
        search.close()


# --- instr fit's question and its answer, as the command and the Python API ask it -------------


@dataclass(frozen=True)
class FitRequest:
    """What fits ``model`` (default: the bundled model) in each device's memory: ``memory`` as
    --memory takes it (DEVICE=SIZE, each device's free memory otherwise), the largest context
    ``n_ctx`` (default: n_ctx_train), a fixed ``gpu_layers`` (default: searched where a GPU
    exists), each of ``quants`` (default: the file's own type), with the projector ``mmproj``'s
    weights and compute buffers counted (on the GPU unless ``mmproj_offload`` is off), and beside
    it llama.cpp's own projection (``compare_llama``) or a real run's buffers (``measure``)."""

    model: Path | None = None
    memory: tuple[str, ...] = ()
    n_ctx: int | None = None
    gpu_layers: int | None = None
    offload: offload.Offload = field(default_factory=offload.Offload)
    quants: tuple[str, ...] = ()
    threads: int | None = None
    compare_llama: bool = False
    measure: bool = False
    mmproj: Path | None = None
    mmproj_offload: bool = True


@dataclass
class FitResult:
    """One ``Answer`` per quantization asked."""

    answers: list[Answer]

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.answers]

    def failure(self) -> UserError | None:
        """Nothing fits: out of memory, exit status 3 (as a run that does not fit)."""
        if any(a.setting for a in self.answers):
            return None
        over = sorted({dev for a in self.answers for dev in a.overflow})
        return memory.OutOfMemory(f"nothing fits: the smallest setting overflows {', '.join(over)}")


def fit(
    request: FitRequest, machine: Machine, say: Callable[[str], None] = lambda _: None
) -> FitResult:
    """``instr fit``: each quantization's answer (``fit_model``) on ``machine``, with
    llama-fit-params' beside it where asked (or built, for a setting of the CPU alone) and a
    measuring run where asked. ``say`` hears the progress of a quantization and why
    llama-fit-params is not shown."""
    path = request.model if request.model is not None else models.default_model()
    models.check_gguf(path)
    o = request.offload
    projector = None
    if request.mmproj is not None:
        projector = machine.projector(request.mmproj, request.mmproj_offload, o.devices)
    machine.load()
    if o.rpc and (request.compare_llama or request.measure):
        # this process holds each server's one connection while it answers
        raise UserError(
            "--compare-llama and --measure can't share --rpc servers with instr fit (a server "
            "serves one client at a time): run them without --rpc"
        )
    names = machine.devices(o.rpc)  # --rpc's servers become devices --memory may name
    fc = FitConfig(
        model=path,
        memory=parse_memory(request.memory, names),
        n_ctx=request.n_ctx,
        gpu_layers=request.gpu_layers,
        offload=o,
        threads=request.threads,
        projector=projector,
    )
    files = machine.quantized(path, request.quants, say)
    # llama-fit-params beside ours: asked for, or on its own when it is built and the setting
    # is the CPU's alone (the tools are built for the CPU: a device such as Vulkan0 is not in them)
    exe = (
        None
        if o.rpc or (o.devices and not request.compare_llama)
        else machine.fit_params_program(required=request.compare_llama)
    )
    answers = []
    for quant, file in files:
        answers.append(fit_model(machine, file, quant, fc))
        if answers[-1].setting is not None:
            beside(machine, answers[-1], fc, request, exe, say)
    return FitResult(answers)


def beside(
    machine: Machine,
    answer: Answer,
    fc: FitConfig,
    request: FitRequest,
    exe: Path | None,
    say: Callable[[str], None],
) -> None:
    """llama-fit-params' projection of the answer (``exe``), and a real run's buffers where
    asked (the projector placed as the answer counted it), each under a memory budget of what the
    answer's footprint says each device holds."""
    s = answer.setting
    assert s is not None
    budget = {dev: answer.memory[dev] for dev in answer.footprint if dev in answer.memory}
    if exe is not None:
        try:
            answer.llama_fit = machine.llama_fit_params(exe, fc.run_config(answer.model, s), budget)
        except UserError as exc:
            if request.compare_llama:
                raise
            say(f"instr fit: llama-fit-params not shown: {exc}")
    if request.measure:
        cfg = fc.run_config(answer.model, s)
        answer.measured = machine.measured_run(cfg, budget, answer.media())
