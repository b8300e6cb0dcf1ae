"""What fits (``instr fit``): the largest context, the most offloaded layers and the KV cache type
that fit each device's memory, and the whole footprint per device and purpose at that setting.

It knows by asking llama.cpp, as llama.cpp's own fit does (the pin's common/fit.cpp): the model is
loaded with ``no_alloc`` and no weights read, a context is made with the candidate's parameters,
which builds and reserves the real graphs without allocating them, and
``llama_get_memory_breakdown`` (``bindings.memory_breakdown``) says what each buffer type would
take. There is no formula here. The context parameters are the ones ``instr run`` passes
(``context_params``: llama_cpp.Llama's, field for field; tests/test_fit.py holds every field to a
real Llama's), so a projection is what a run of the same setting measures.

llama.cpp's breakdown leaves out the output buffer (the logits), which a context allocates even
with ``no_alloc``: a probe measures it from the patched library's table of live buffers (a session
begins with every live buffer) and counts it, so the answer also fits that.

A multimodal projector (``--mmproj``) counts with its weights and compute buffers on the device its
encoder runs on, by llama.cpp's own measure of it (``fit_projector``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.deciding import fit_projector
from llamacpp_instr.deciding.fit_projector import Projector
from llamacpp_instr.native import bindings, models
from llamacpp_instr.running import context_defaults, devices, offload, runner
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.tensor_overrides import TensorOverrides

# the KV caches fit tries, in order: f16 with llama.cpp's default flash attention (auto), then
# q8_0 (a quantized V cache needs flash attention)
FIT_KV: tuple[tuple[str, str, bool | None], ...] = (("f16", "f16", None), ("q8_0", "q8_0", True))
# contexts are tried in steps of this many cells (llama.cpp pads a KV cache to 256)
CTX_STEP = 256
# the purposes llama_get_memory_breakdown counts (its model, context and compute)
BREAKDOWN_PURPOSES = ("weights", "kv_cache", "compute")

Footprint = dict[str, dict[str, int]]  # {device: {purpose: bytes}}


def context_params(cfg: runner.RunConfig) -> Any:
    """The llama_context_params llama_cpp.Llama makes of what ``runner.load_model`` passes it for
    ``cfg`` (its __init__, mirrored field by field)."""
    ll = bindings.import_llama_cpp()
    threads = runner.resolve_threads(cfg.threads)
    n_batch = min(cfg.n_ctx, cfg.n_batch)  # as Llama clamps it
    p = ll.llama_context_default_params()
    p.n_ctx = cfg.n_ctx
    p.n_batch = n_batch
    p.n_ubatch = min(n_batch, cfg.n_ubatch or cfg.n_batch)
    p.n_threads = threads
    p.n_threads_batch = threads
    p.rope_scaling_type = ll.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    p.pooling_type = ll.LLAMA_POOLING_TYPE_UNSPECIFIED
    p.attention_type = ll.LLAMA_ATTENTION_TYPE_UNSPECIFIED
    p.rope_freq_base = 0
    p.rope_freq_scale = 0
    p.yarn_ext_factor = -1.0
    p.yarn_attn_factor = 1.0
    p.yarn_beta_fast = 32.0
    p.yarn_beta_slow = 1.0
    p.yarn_orig_ctx = 0
    p.embeddings = False
    p.offload_kqv = True
    p.flash_attn_type = context_defaults.flash_attn_type(cfg.flash_attn)
    p.type_k = context_defaults.kv_type_id(cfg.type_k)
    p.type_v = context_defaults.kv_type_id(cfg.type_v)
    p.no_perf = False
    return p


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
        return args + context_defaults.flash_attn_args(self.flash_attn)


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
            "flash_attn": context_defaults.flash_attn_name(s.flash_attn) if s else None,
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
        return out


def device_memory() -> dict[str, int]:
    """Each device's free memory as ggml reports it (a memory budget lowers it)."""
    return {d.name: devices.memory(d)[0] for d in devices.registry()}


def parse_memory(specs: tuple[str, ...]) -> dict[str, int]:
    """--memory DEVICE=SIZE (repeatable, or comma-separated) -> {device: bytes}, each device one
    of ggml's (case-insensitive, named as ggml names it); a one-line UserError otherwise."""
    if not specs:
        return {}
    asked = memory.parse_budget(",".join(specs))
    names = {d.name.lower(): d.name for d in devices.registry()}
    out: dict[str, int] = {}
    for dev, size in asked.items():
        if dev.lower() not in names:
            raise UserError(
                f"unknown device {dev!r} for --memory: the devices are {', '.join(names.values())}"
            )
        out[names[dev.lower()]] = size
    return out


def file_type(path: Path) -> str:
    """The GGUF's own type (its general.file_type) as instr quantize names it (q4_k_m, f16...),
    read by llama.cpp from the model's vocabulary-only load (gguf-py's reader parses the whole
    vocabulary in Python: a minute on a 2-core machine)."""
    from gguf import LlamaFileType
    from llama_cpp import _logger

    _logger.set_verbose(False)
    ll = bindings.import_llama_cpp()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise UserError(models.explain_load_failure(path))
    try:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf))
        name = LlamaFileType(int(buf.value)).name if n > 0 else "unknown"
    except ValueError:
        name = "unknown"
    finally:
        ll.llama_model_free(model)
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


class Prober:
    """One model file loaded with no weights, at one -ngl; contexts made and freed per probe."""

    def __init__(
        self,
        path: Path,
        placement: offload.Placement,
        names: list[str],
        tensors: TensorOverrides | None = None,
    ) -> None:
        ll = bindings.import_llama_cpp()
        self._ll = ll
        self._lib = bindings.load()
        self.names = names  # device names by registry index
        self.path = path
        self._gap: int | None = None  # mapping_gap at this -ngl, once known
        params = ll.llama_model_default_params()
        placement.apply(params)
        params.no_alloc = True
        params.load_mode = ll.LLAMA_LOAD_MODE_NONE
        # the tensor overrides (-ot, --n-cpu-moe) set the params of the load inside the block
        with (tensors or TensorOverrides()).loading():
            self.model = ll.llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise UserError(models.explain_load_failure(path))
        self.n_layer = int(ll.llama_model_n_layer(self.model))
        self.n_ctx_train = int(ll.llama_model_n_ctx_train(self.model))

    def close(self) -> None:
        if self.model:
            self._ll.llama_model_free(self.model)
            self.model = None

    @contextmanager
    def _context(self, cfg: runner.RunConfig) -> Iterator[Any]:
        ctx = self._ll.llama_init_from_model(self.model, context_params(cfg))
        if not ctx:
            raise UserError(
                f"llama.cpp cannot make a context of {cfg.model.name} with this setting"
            )
        try:
            yield ctx
        finally:
            self._ll.llama_free(ctx)

    def footprint(self, cfg: runner.RunConfig) -> Footprint:
        """llama.cpp's projection of ``cfg``: {device: {purpose: bytes}}, zeros left out, with
        the CPU's weights as a run's mapping of the file holds them (``mapping_gap``)."""
        with self._context(cfg) as ctx:
            rows = self._lib.memory_breakdown(ctx)
        if self._gap is None:
            self._learn_gap(self._probe(cfg) or [])
        out: Footprint = {"CPU": {"weights": self._gap}} if self._gap else {}
        for row in rows:
            i = int(row.get("device", -1))
            dev = self.names[i] if 0 <= i < len(self.names) else str(row.get("buffer_type"))
            for purpose in BREAKDOWN_PURPOSES:
                if int(row.get(purpose, 0)) > 0:
                    d = out.setdefault(dev, {})
                    d[purpose] = d.get(purpose, 0) + int(row[purpose])
        return out

    def _learn_gap(self, records: list[dict[str, Any]]) -> None:
        start = next((r for r in records if r.get("type") == "session_start"), {})
        self._gap = mapping_gap(self.path, start.get("weights") or [])

    def _probe(self, cfg: runner.RunConfig) -> list[dict[str, Any]] | None:
        """The records of a session begun and ended on a context of ``cfg`` (the live buffers,
        the weights and where they are); None when a session can't be opened (one is open
        already: LLAMA_INSTR_LOG)."""
        with self._context(cfg) as ctx, tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "probe.log"
            try:
                self._lib.session_begin(ctx, str(log), "minimal", {"tool": "instr fit"})
                self._lib.session_end()
            except bindings.SessionError:
                return None
            return [json.loads(line) for line in log.read_text().splitlines()]

    def unlisted(self, cfg: runner.RunConfig) -> Footprint:
        """What a context allocates even with no_alloc and llama.cpp's breakdown leaves out (its
        output buffer): the live buffers of the patched library's table, which a session begins
        with. {} when a session can't be opened."""
        records = self._probe(cfg)
        if records is None:
            return {}
        if self._gap is None:  # the same session's weights: no second probe for the gap
            self._learn_gap(records)
        live: dict[int, dict[str, Any]] = {}
        for r in records:
            if r.get("type") == "memory_alloc":
                live[r["id"]] = r
            elif r.get("type") == "memory_free":
                live.pop(r["id"], None)
        out: Footprint = {}
        for r in live.values():
            if r["purpose"] in BREAKDOWN_PURPOSES or r["purpose"] == "recurrent" or not r["bytes"]:
                continue
            i = int(r["device"])
            dev = self.names[i] if 0 <= i < len(self.names) else str(r["buffer_type"])
            d = out.setdefault(dev, {})
            d[r["purpose"]] = d.get(r["purpose"], 0) + int(r["bytes"])
        return out


def mapping_gap(path: Path, weights: list[dict[str, Any]]) -> int:
    """What a run's mapping of the file holds beyond the weights kept in the CPU's own buffer
    type. A run maps (``use_mmap``, llama.cpp's default) the file from the first to the last byte
    of those weights as one buffer (CPU_Mapped), and its breakdown counts the whole range, while
    a no_alloc projection counts their bytes alone: the two differ by the weights that lie
    between them in the file but live elsewhere (in an extra buffer type, AMX or CPU_REPACK, or
    on a GPU) and by the file's alignment padding."""
    from gguf import GGUFReader

    kept = {str(w.get("name")) for w in weights if w.get("buffer") == "CPU"}
    if not kept:
        return 0
    spans = [
        (int(t.data_offset), int(t.n_bytes)) for t in GGUFReader(path).tensors if t.name in kept
    ]
    if not spans:
        return 0
    first = min(o for o, _ in spans)
    last = max(o + n for o, n in spans)
    return max(0, last - first - sum(n for _, n in spans))


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


def fit_model(path: Path, quant: str, fc: FitConfig) -> Answer:
    """The largest context (a multiple of 256 up to the cap), then the most layers offloaded
    (searched only when a GPU exists and -ngl was not given), then an f16 before a q8_0 KV
    cache, that fit every device's memory."""
    from llama_cpp import _logger

    _logger.set_verbose(False)  # llama.cpp's lines per tensor and per reservation
    bindings.load()
    names = [d.name for d in devices.registry()]
    limits = {**device_memory(), **fc.memory}
    devices.add_rpc_servers(fc.offload.rpc)
    used = (
        devices.default_offload()
        if fc.offload.devices is None
        else devices.by_names(fc.offload.devices)
    )
    gpu = bool(used)  # a device to offload to (RPC servers are GPUs to llama.cpp)

    def base(setting: Setting) -> runner.RunConfig:
        return runner.RunConfig(
            model=path,
            prompt="",
            n_ctx=setting.n_ctx,
            n_batch=fc.n_batch,
            n_ubatch=fc.n_ubatch,
            threads=fc.threads,
            flash_attn=setting.flash_attn,
            type_k=setting.type_k,
            type_v=setting.type_v,
        )

    probers: dict[int, Prober] = {}

    def prober(ngl: int) -> Prober:
        if ngl not in probers:
            # no layer offloaded: the CPU only (and no warning that the devices go unused)
            o = (
                replace(fc.offload, gpu_layers=ngl)
                if ngl
                else offload.Offload(repack=fc.offload.repack)
            )
            placement = offload.prepare(o)
            probers[ngl] = Prober(path, placement, names)
        return probers[ngl]

    try:
        first = prober(0 if not gpu else (fc.gpu_layers or 0))
        n_layer, n_ctx_train = first.n_layer, first.n_ctx_train
        cap = min(fc.n_ctx or n_ctx_train, n_ctx_train) if n_ctx_train > 0 else fc.n_ctx or 4096
        ctxs = list(range(CTX_STEP, cap + 1, CTX_STEP)) or [cap]
        extra = first.unlisted(base(Setting(ctxs[0], 0)))
        projector = fc.projector
        answer = Answer(path, quant, limits, n_ctx_train, n_layer, gpu)
        answer.mmproj = projector.path if projector else None

        def project(s: Setting) -> Footprint:
            fp = merge(prober(s.n_gpu_layers).footprint(base(s)), extra)
            return merge(fp, projector.footprint(s.flash_attn)) if projector else fp

        def largest_ctx(ngl: int, kv: tuple[str, str, bool | None]) -> Setting | None:
            """The largest context that fits at ``ngl`` and ``kv`` (binary search: the footprint
            grows with the context)."""
            lo, hi, best = 0, len(ctxs) - 1, None
            while lo <= hi:
                mid = (lo + hi) // 2
                s = Setting(ctxs[mid], ngl, *kv)
                if overflows(project(s), limits):
                    hi = mid - 1
                else:
                    best, lo = s, mid + 1
            return best

        if not gpu:
            layer_counts = [0]
        elif fc.gpu_layers is not None:
            layer_counts = [min(fc.gpu_layers, n_layer + 1)]
        else:
            layer_counts = list(range(n_layer + 2))  # n_layer + 1: the output layer too

        def fits(ngl: int, kv: tuple[str, str, bool | None]) -> bool:
            return not overflows(project(Setting(ctxs[-1], ngl, *kv)), limits)

        def most_layers(kv: tuple[str, str, bool | None]) -> Setting | None:
            """The whole context with the most layers offloaded, or the largest context.

            A GPU's share grows with the layers and the CPU's shrinks, so the layer counts at
            which the whole context fits are one run: from 0 when the GPU limits, up to all when
            the CPU does (a binary search finds its end). When neither end fits, every count is
            tried for its largest context."""
            lo, hi = layer_counts[0], layer_counts[-1]
            if fits(hi, kv):
                return Setting(ctxs[-1], hi, *kv)
            if lo < hi and fits(lo, kv):
                while hi - lo > 1:  # fits(lo), not fits(hi)
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fits(mid, kv) else (lo, mid)
                return Setting(ctxs[-1], lo, *kv)
            best = [s for ngl in reversed(layer_counts) if (s := largest_ctx(ngl, kv))]
            return max(best, key=lambda s: (s.n_ctx, s.n_gpu_layers)) if best else None

        found: list[Setting] = []
        for kv in FIT_KV:
            s = most_layers(kv)
            if s is not None:
                found.append(s)
                if s.n_ctx == ctxs[-1]:
                    break  # the whole context fits: a q8_0 cache would only lose precision
        if found:
            # the largest context, then the most layers; at equal ones the f16 cache (first)
            best = max(found, key=lambda s: (s.n_ctx, s.n_gpu_layers, -found.index(s)))
            answer.setting = best
            answer.footprint = project(best)
        else:
            smallest = Setting(ctxs[0], layer_counts[-1], *FIT_KV[-1])
            answer.footprint = project(smallest)
            answer.overflow = overflows(answer.footprint, limits)
        return answer
    finally:
        for p in probers.values():
            p.close()


# --- beside llama.cpp's own fit, and a real run ------------------------------------------------


def llama_fit_params(
    exe: Path, answer: Answer, fc: FitConfig, budget: dict[str, int]
) -> dict[str, dict[str, int]]:
    """llama-fit-params --fit-print at the answer's setting, under a memory budget of ``budget``:
    {device: {"weights", "kv_cache", "compute": MiB}} (its own rounding down to MiB; its host
    row is the CPU's)."""
    s = answer.setting
    assert s is not None
    threads = runner.resolve_threads(fc.threads)
    n_batch = min(s.n_ctx, fc.n_batch)
    cmd = [
        str(exe), "-m", str(answer.model), "-c", str(s.n_ctx), "-ngl", str(s.n_gpu_layers),
        "-b", str(n_batch), "-ub", str(min(n_batch, fc.n_ubatch or fc.n_batch)),
        "-fa", context_defaults.flash_attn_name(s.flash_attn), "-ctk", s.type_k, "-ctv", s.type_v,
        "-t", str(threads), "--fit-print", "on",
    ]  # fmt: skip
    cmd += offload_args(fc.offload, split_flag="-ts")
    env = {**os.environ, memory.ENV_VAR: memory.format_budget(budget)}
    env.pop("LLAMA_INSTR_LOG", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"llama-fit-params failed ({r.returncode}): {tail}")
    out: dict[str, dict[str, int]] = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            dev = "CPU" if parts[0] == "Host" else parts[0]
            out[dev] = dict(zip(BREAKDOWN_PURPOSES, (int(p) for p in parts[1:]), strict=True))
    if not out:
        raise UserError("llama-fit-params printed no projection")
    return out


def offload_args(o: offload.Offload, split_flag: str) -> list[str]:
    """--device, --rpc, the tensor split and --no-repack as a command line (instr run's or
    llama.cpp's)."""
    args = [] if o.repack else ["--no-repack"]
    if o.devices is not None:
        args += ["--device", ",".join(o.devices) or "none"]
    if o.rpc:
        args += ["--rpc", ",".join(o.rpc)]
    if o.tensor_split is not None:
        args += [split_flag, ",".join(f"{x:g}" for x in o.tensor_split)]
    return args


def live_at_last_step(log: Path, names: list[str]) -> Footprint:
    """A session log's live buffers (memory_alloc less memory_free) when its last step ended:
    {device: {purpose: bytes}}."""
    live: dict[int, dict[str, Any]] = {}
    at_step: dict[int, dict[str, Any]] = {}
    with log.open() as f:
        for line in f:
            r = json.loads(line)
            t = r.get("type")
            if t == "memory_alloc":
                live[r["id"]] = r
            elif t == "memory_free":
                live.pop(r["id"], None)
            elif t == "step_end":
                at_step = dict(live)
    out: Footprint = {}
    for r in at_step.values():
        if not r["bytes"]:
            continue
        i = int(r["device"])
        dev = names[i] if 0 <= i < len(names) else str(r["buffer_type"])
        purpose = "kv_cache" if r["purpose"] == "recurrent" else r["purpose"]
        d = out.setdefault(dev, {})
        d[purpose] = d.get(purpose, 0) + int(r["bytes"])
    return out


def measure(answer: Answer, fc: FitConfig, budget: dict[str, int], log: Path) -> Footprint:
    """Run the answer's setting for real (``instr run``, two tokens, minimal level, with the
    projector loaded where there is one) under a memory budget of ``budget``; the live buffers
    when its last step ended."""
    s = answer.setting
    assert s is not None
    cmd = [sys.executable, "-m", "llamacpp_instr.cli", "run", str(answer.model), "-p", "Hello",
           "-n", "2", "--level", "minimal", "-o", str(log), "--batch", str(fc.n_batch),
           *s.run_args(answer.gpu)]  # fmt: skip
    if fc.n_ubatch:
        cmd += ["--ubatch", str(fc.n_ubatch)]
    if fc.threads:
        cmd += ["-t", str(fc.threads)]
    if fc.projector:
        cmd += ["--mmproj", str(fc.projector.path)]
    cmd += offload_args(fc.offload, split_flag="--tensor-split")
    env = {**os.environ, memory.ENV_VAR: memory.format_budget(budget)}
    env.pop("LLAMA_INSTR_LOG", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"the measuring run failed ({r.returncode}): {tail}")
    return live_at_last_step(log, [d.name for d in devices.registry()])


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


def fit(request: FitRequest, say: Callable[[str], None] = lambda _: None) -> FitResult:
    """``instr fit``: each quantization's answer (``fit_model``), with llama-fit-params' beside it
    where asked (or built, for a setting of the CPU alone) and a measuring run where asked.
    ``say`` hears the progress of a quantization and why llama-fit-params is not shown."""
    path = request.model if request.model is not None else models.default_model()
    models.check_gguf(path)
    if request.mmproj is not None:
        fit_projector.check(request.mmproj)
        if request.measure and not request.mmproj_offload:
            raise UserError(
                "--measure runs instr run, whose encoder runs where llama.cpp puts it: measure "
                "without --no-mmproj-offload"
            )
    bindings.load()
    o = request.offload
    if o.rpc and (request.compare_llama or request.measure):
        # this process holds each server's one connection while it answers
        raise UserError(
            "--compare-llama and --measure can't share --rpc servers with instr fit (a server "
            "serves one client at a time): run them without --rpc"
        )
    devices.add_rpc_servers(o.rpc)  # --rpc's servers become devices --memory may name
    fc = FitConfig(
        model=path,
        memory=parse_memory(request.memory),
        n_ctx=request.n_ctx,
        gpu_layers=request.gpu_layers,
        offload=o,
        threads=request.threads,
        projector=(
            Projector(request.mmproj, request.mmproj_offload, o.devices)
            if request.mmproj is not None
            else None
        ),
    )
    files = quantized_files(path, request.quants, say)
    # llama-fit-params beside ours: asked for, or on its own when it is built and the setting
    # is the CPU's alone (the tools are built for the CPU: a device such as Vulkan0 is not in them)
    exe = (
        None
        if o.rpc or (o.devices and not request.compare_llama)
        else _fit_params_program(required=request.compare_llama)
    )
    answers = []
    for quant, file in files:
        answer = fit_model(file, quant, fc)
        budget = {dev: answer.memory[dev] for dev in answer.footprint if dev in answer.memory}
        if answer.setting is not None and exe is not None:
            try:
                answer.llama_fit = llama_fit_params(exe, answer, fc, budget)
            except UserError as exc:
                if request.compare_llama:
                    raise
                say(f"instr fit: llama-fit-params not shown: {exc}")
        if answer.setting is not None and request.measure:
            with tempfile.TemporaryDirectory() as tmp:
                answer.measured = measure(answer, fc, budget, Path(tmp) / "measure.log")
        answers.append(answer)
    return FitResult(answers)


def quantized_files(
    path: Path, quants: tuple[str, ...], say: Callable[[str], None] = lambda _: None
) -> list[tuple[str, Path]]:
    """(quantization, file) for each of ``quants`` (--quant: fit, plan, predict): the file itself
    for its own type, else the file quantized into the cache (``say`` hears the quantizer)."""
    from llamacpp_instr.running.quant.quantize import TYPES
    from llamacpp_instr.running.quant.sweep import quantized

    own = file_type(path)
    asked = [q.lower() for q in quants] or [own]
    for q in asked:
        if q not in TYPES and q != own:
            raise UserError(f"unknown --quant {q!r}: choose one of {', '.join(TYPES)}")
    return [(q, path if q == own else quantized(path, q, 0, say)) for q in dict.fromkeys(asked)]


def _fit_params_program(required: bool) -> Path | None:
    """llama-fit-params of the current patches: required with --compare-llama (a one-line error
    naming the build command if missing), else used when it is built."""
    from llamacpp_instr.native import tools

    try:
        return tools.find("llama-fit-params")
    except UserError:
        if required:
            raise
        return None
