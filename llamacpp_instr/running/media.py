"""Images and sounds in a run: llama.cpp's mtmd (through llama-cpp-python's ``mtmd_cpp``) loads a
projector (an mmproj file) beside the model, decodes each medium, tokenizes them with the prompt
and evaluates the chunks into the model, its helper encoding each medium's slices and decoding
their embeddings, as llama-mtmd-cli does. A session open meanwhile records each medium, each
encode and the steps that decode it (docs/schema.md, "Encodes" and `media`).

What a user gives is checked before the model loads and before any log exists (``MediaInputs``,
with ``run_config``: each file's kind and size from its own bytes, the projector's kind; here:
that this build has libmtmd), and then, with the model loaded, that the projector feeds this model
and hears or sees what it is given. mtmd's context parameters are built in one place,
``context_params``, for a run and for the projector's measure (``projector_memory``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings
from llamacpp_instr.running import context_defaults, devices
from llamacpp_instr.running.media_files import AUDIO
from llamacpp_instr.running.run_config import RunConfig, resolve_threads


def import_mtmd() -> Any:
    """llama-cpp-python's ``mtmd_cpp`` on the libmtmd beside the libllama in use: the one in
    LLAMA_CPP_LIB_PATH when that is set (a libmtmd of another build would run on a libllama it
    was not built with) and MTMD_CPP_LIB is not; a one-line error where there is none."""
    import os

    bindings.import_llama_cpp()
    lib = os.environ.get("LLAMA_CPP_LIB_PATH")
    if lib and "MTMD_CPP_LIB" not in os.environ:
        os.environ["MTMD_CPP_LIB"] = lib
    try:
        from llama_cpp import mtmd_cpp
    except (OSError, RuntimeError) as exc:  # (FileNotFoundError: no libmtmd there)
        raise UserError(
            f"this llama-cpp-python build has no libmtmd ({exc}): `instr build` builds it"
        ) from None
    return mtmd_cpp


_QUIET: list[Any] = []  # the callback, alive as long as mtmd may call it
_LAST_ERROR: list[str] = [""]  # the last error line mtmd logged
GGML_LOG_LEVEL_ERROR = 4


def quiet_mtmd(mtmd_cpp: Any) -> None:
    """mtmd's and its helper's log lines dropped, as llama-cpp-python's are for a Llama made with
    verbose=False (a run prints its text and its one line, a refusal one line), but the last
    error, which a refusal quotes."""
    import llama_cpp

    def log(level: int, text: bytes, user: Any) -> None:
        if level == GGML_LOG_LEVEL_ERROR and text and text.strip():
            _LAST_ERROR[0] = text.decode(errors="replace").strip().splitlines()[0]

    if not _QUIET:
        _QUIET.append(llama_cpp.llama_log_callback(log))
        mtmd_cpp.mtmd_log_set(_QUIET[0], None)
        mtmd_cpp.mtmd_helper_log_set(_QUIET[0], None)
    _LAST_ERROR[0] = ""


def mtmd_said() -> str:
    """mtmd's last error line, for a one-line refusal (': ' and the line, or nothing)."""
    return f": {_LAST_ERROR[0]}" if _LAST_ERROR[0] else ""


def context_params(
    mtmd_cpp: Any,
    offload: bool,
    device_names: tuple[str, ...] | None,
    flash_attn: bool | None,
    n_threads: int | None = None,
    warmup: bool = True,
) -> Any:
    """The ``mtmd_context_params`` a projector is loaded with, as llama.cpp's programs build
    theirs (llama-server, llama-mtmd-cli): its encoder on the first of ``device_names`` (the
    offload's --device; ``()``, none: the CPU), else on the first GPU of ggml's registry (mtmd's
    own choice), unless ``offload`` is off (--no-mmproj-offload: the CPU); the text model's
    ``flash_attn`` (None: auto); ``n_threads`` CPU threads (None: mtmd's default); mtmd's warm-up
    (its compute buffers reserved at the load) as the run's own (--no-warmup: at the first
    encode). The devices named are registered already (RPC servers: ``placement.prepare``)."""
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = offload and device_names != ()
    params.device = None
    if params.use_gpu and device_names:
        (first,) = devices.by_names(device_names[:1])
        params.device = first.ptr
    params.flash_attn_type = context_defaults.flash_attn_type(flash_attn)
    params.print_timings = False
    if n_threads is not None:
        params.n_threads = n_threads
    params.warmup = warmup
    return params


class Media:
    """mtmd's context for a loaded model and the media it decoded: how many positions a prompt
    with them takes, and its ``evaluate`` into the model. Free it with ``close``."""

    def __init__(self, llm: Any, cfg: RunConfig) -> None:
        """mtmd's context for ``cfg.media`` beside ``llm`` (``cfg``'s model, loaded), placed and
        threaded as ``cfg`` says (``context_params``), and the media decoded."""
        mtmd_cpp = import_mtmd()
        self._mtmd = mtmd_cpp
        self._llm = llm
        self._bitmaps: list[Any] = []
        inputs = cfg.media
        assert inputs.mmproj is not None
        quiet_mtmd(mtmd_cpp)
        params = context_params(
            mtmd_cpp,
            inputs.offload,
            cfg.offload.devices,
            cfg.flash_attn,
            resolve_threads(cfg.threads),
            cfg.warmup,
        )
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(inputs.mmproj).encode(), llm.model, params)
        if not self._ctx:
            raise UserError(
                f"mtmd could not load the projector {inputs.mmproj} for {llm.model_path}"
                + mtmd_said()
            )
        try:
            for kind, path in inputs.files():
                self._bitmaps.append(self._load(kind, path))
        except BaseException:
            self.close()
            raise

    def _load(self, kind: str, path: Path) -> Any:
        can = (
            self._mtmd.mtmd_support_audio(self._ctx)
            if kind == AUDIO
            else self._mtmd.mtmd_support_vision(self._ctx)
        )
        if not can:
            raise UserError(f"--{kind} {path}: this projector takes no {kind}")
        bitmap = self._mtmd.mtmd_helper_bitmap_init_from_file(self._ctx, str(path).encode(), False)
        if not bitmap:
            raise UserError(f"--{kind} {path}: mtmd could not decode it" + mtmd_said())
        return bitmap

    @property
    def marker(self) -> str:
        return str(self._mtmd.mtmd_default_marker().decode())

    def with_markers(self, prompt: str) -> str:
        """The prompt with one marker per medium: before it (as llama-mtmd-cli puts them), or
        where the prompt puts them itself."""
        n = prompt.count(self.marker)
        if n == 0:
            return self.marker * len(self._bitmaps) + "\n" + prompt
        if n != len(self._bitmaps):
            raise UserError(
                f"the prompt has {n} {self.marker} markers for {len(self._bitmaps)} media"
            )
        return prompt

    def _tokenize(self, text: str, add_special: bool) -> Any:
        """The chunks of ``text`` (with its markers) and the media: text tokens, and each medium's
        slices (a session open records each medium here: its preprocessing). The caller frees
        them."""
        m = self._mtmd
        chunks = m.mtmd_input_chunks_init()
        data = text.encode()
        inp = m.mtmd_input_text(
            text=data, text_len=len(data), add_special=add_special, parse_special=True
        )
        bitmaps = (m.mtmd_bitmap_p_ctypes * len(self._bitmaps))(*self._bitmaps)
        rc = m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), bitmaps, len(self._bitmaps))
        if rc != 0:
            m.mtmd_input_chunks_free(chunks)
            raise UserError(f"mtmd could not tokenize the prompt with its media{mtmd_said()}")
        return chunks

    def positions(self, text: str, add_special: bool) -> int:
        """The positions ``text`` and the media take in the model's context."""
        chunks = self._tokenize(text, add_special)
        try:
            return int(self._mtmd.mtmd_helper_get_n_pos(chunks))
        finally:
            self._mtmd.mtmd_input_chunks_free(chunks)

    def evaluate(self, text: str, add_special: bool) -> list[int]:
        """Tokenize ``text`` with the media and decode every chunk but the prompt's last token,
        as llama-cpp-python's multimodal chat handlers do (text by ``Llama.eval``, media by mtmd's
        helper: each medium's slices encoded, their embeddings decoded in batches of
        ``n_batch``); the prompt's tokens for ``Llama.generate``, which decodes the last one and
        samples."""
        chunks = self._tokenize(text, add_special)
        try:
            return self._evaluate(chunks)
        finally:
            self._mtmd.mtmd_input_chunks_free(chunks)

    def _evaluate(self, chunks: Any) -> list[int]:
        import llama_cpp

        m, llm = self._mtmd, self._llm
        n = m.mtmd_input_chunks_size(chunks)
        last = m.mtmd_input_chunks_get(chunks, n - 1) if n else None
        if last is None or m.mtmd_input_chunk_get_type(last) != m.MTMD_INPUT_CHUNK_TYPE_TEXT:
            raise UserError("the prompt must end with text after its last medium")
        tail: list[int] = []
        for i in range(n):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                ptr = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens = [int(ptr[j]) for j in range(count.value)]
                if i == n - 1:
                    tokens, tail = tokens[:-1], tokens[-1:]
                if tokens:
                    llm.eval(tokens)
                continue
            n_past = llama_cpp.llama_pos(0)
            rc = m.mtmd_helper_eval_chunk_single(
                self._ctx,
                llm._ctx.ctx,
                chunk,
                llama_cpp.llama_pos(llm.n_tokens),
                llama_cpp.llama_seq_id(0),
                llm.n_batch,
                False,
                ctypes.byref(n_past),
            )
            if rc != 0:
                raise RuntimeError(f"mtmd could not evaluate a medium (error {rc})")
            llm.n_tokens = int(n_past.value)
        return [int(t) for t in llm.input_ids[: llm.n_tokens]] + tail

    def close(self) -> None:
        for bitmap in self._bitmaps:
            self._mtmd.mtmd_bitmap_free(bitmap)
        self._bitmaps = []
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
