"""A model's memory at a setting, by llama.cpp's own projection (``instr fit``, ``instr plan``).

It knows by asking llama.cpp, as llama.cpp's own fit does (the pin's common/fit.cpp): the model is
loaded with ``no_alloc`` and no weights read (``Prober``), a context is made with the candidate's
parameters, which builds and reserves the real graphs without allocating them, and
``llama_get_memory_breakdown`` (``bindings.memory_breakdown``) says what each buffer type would
take. There is no formula here. The context parameters are the ones ``instr run`` passes
(``context_params``: llama_cpp.Llama's, field for field; tests/test_fit.py holds every field to a
real Llama's), so a projection is what a run of the same setting measures.

llama.cpp's breakdown leaves out the output buffer (the logits), which a context allocates even
with ``no_alloc``: a probe measures it from the patched library's table of live buffers (a session
begins with every live buffer) and counts it (``Prober.unlisted``).
"""

from __future__ import annotations

import ctypes
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings, models
from llamacpp_instr.running import context_defaults, tensor_buffers
from llamacpp_instr.running.placement import Placement
from llamacpp_instr.running.run_config import RunConfig, resolve_threads
from llamacpp_instr.running.tensor_overrides import TensorOverrides

# the purposes llama_get_memory_breakdown counts (its model, context and compute)
BREAKDOWN_PURPOSES = ("weights", "kv_cache", "compute")

Footprint = dict[str, dict[str, int]]  # {device: {purpose: bytes}}


def context_params(cfg: RunConfig) -> Any:
    """The llama_context_params llama_cpp.Llama makes of what ``runner.load_model`` passes it for
    ``cfg`` (its __init__, mirrored field by field)."""
    ll = bindings.import_llama_cpp()
    threads = resolve_threads(cfg.threads)
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


class Prober:
    """One model file loaded with no weights, at one -ngl; contexts made and freed per probe."""

    def __init__(
        self,
        path: Path,
        placement: Placement,
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
        with tensor_buffers.loading(tensors or TensorOverrides()):
            self.model = ll.llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise UserError(models.explain_load_failure(path))
        self.n_layer = int(ll.llama_model_n_layer(self.model))
        self.n_ctx_train = int(ll.llama_model_n_ctx_train(self.model))

    def close(self) -> None:
        if self.model:
            self._ll.llama_model_free(self.model)
            self.model = None

    def architecture(self) -> str:
        """The model's general.architecture ("" where it names none)."""
        buf = ctypes.create_string_buffer(128)
        n = self._ll.llama_model_meta_val_str(self.model, b"general.architecture", buf, 128)
        return buf.value.decode(errors="replace") if n > 0 else ""

    def graph(self, cfg: RunConfig, n_tokens: int) -> dict[str, Any]:
        """The graph record of a compute of ``n_tokens`` in a context of ``cfg``, built and split
        by llama.cpp and ggml's scheduler, never computed (``llama_instr_graph_reserve``)."""
        with self._context(cfg) as ctx:
            rec: dict[str, Any] = self._lib.graph_reserve(ctx, n_tokens, 1)
        rec.setdefault("ctx", 0)
        return rec

    @contextmanager
    def _context(self, cfg: RunConfig) -> Iterator[Any]:
        ctx = self._ll.llama_init_from_model(self.model, context_params(cfg))
        if not ctx:
            raise UserError(
                f"llama.cpp cannot make a context of {cfg.model.name} with this setting"
            )
        try:
            yield ctx
        finally:
            self._ll.llama_free(ctx)

    def footprint(self, cfg: RunConfig) -> Footprint:
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

    def _probe(self, cfg: RunConfig) -> list[dict[str, Any]] | None:
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

    def unlisted(self, cfg: RunConfig) -> Footprint:
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
