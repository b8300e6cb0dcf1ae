"""Images and sounds in a run: llama.cpp's mtmd (through llama-cpp-python's ``mtmd_cpp``) loads a
projector (an mmproj file) beside the model, decodes each medium, tokenizes them with the prompt
and evaluates the chunks into the model, its helper encoding each medium's slices and decoding
their embeddings, as llama-mtmd-cli does. A session open meanwhile records each medium, each
encode and the steps that decode it (docs/schema.md, "Encodes" and `media`).

Everything a user gives is checked before the model loads and before any log exists: each file's
kind from its first bytes and an image's size from its header (a decoder handed a forged header
allocates what the header claims), the projector's kind, and then, with the model loaded, that
the projector feeds this model and hears or sees what it is given.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings, models
from llamacpp_instr.running import context_defaults

# An image's largest side mtmd is given: past it a decoder's buffer alone is gigabytes, and every
# projector resizes to a few thousand pixels at most.
IMAGE_MAX_SIDE = 16384

IMAGE, AUDIO = "image", "audio"


@dataclass(frozen=True)
class MediaInputs:
    """A run's projector and the media it reads, in the prompt's order: the images, then the
    sounds."""

    mmproj: Path | None = None
    images: tuple[Path, ...] = ()
    audio: tuple[Path, ...] = ()

    def files(self) -> list[tuple[str, Path]]:
        return [(IMAGE, p) for p in self.images] + [(AUDIO, p) for p in self.audio]

    def __bool__(self) -> bool:
        return self.mmproj is not None

    def validate(self) -> None:
        """One line for the first thing wrong, before the model loads."""
        if self.mmproj is None:
            if self.images or self.audio:
                raise UserError("--image and --audio need --mmproj (the model's projector file)")
            return
        check_projector(self.mmproj)
        import_mtmd()
        for kind, path in self.files():
            check_file(kind, path)

    def metadata(self) -> dict[str, Any]:
        if self.mmproj is None:
            return {}
        return {
            "mmproj": str(self.mmproj),
            "media": [{"kind": kind, "path": str(path)} for kind, path in self.files()],
        }


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


def check_projector(path: Path) -> None:
    """``path`` is a GGUF projector (llama.cpp's ``clip`` architecture), not a model."""
    models.check_gguf(path)
    arch = models.gguf_architecture(path)
    if arch != "clip":
        raise UserError(
            f"{path} is not a projector (mmproj) file: its architecture is {arch or 'unknown'}, "
            "a projector's is clip"
        )


def check_file(kind: str, path: Path) -> None:
    """A medium file that exists, is of its kind by its first bytes, and, an image, of a size
    mtmd can hold."""
    if not path.is_file():
        raise UserError(f"--{kind} {path}: no such file")
    try:
        with path.open("rb") as f:
            head = f.read(64 * 1024)
    except OSError as exc:
        raise UserError(f"--{kind} {path}: {exc.strerror}") from None
    if kind == AUDIO:
        if not is_audio(head):
            raise UserError(f"--audio {path}: not a sound mtmd reads (WAV, MP3 or FLAC)")
        return
    if is_audio(head):
        raise UserError(f"--image {path}: a sound, not an image (give it with --audio)")
    size = image_size(head)
    if size is None:
        raise UserError(
            f"--image {path}: not an image mtmd reads (JPEG, PNG, GIF, BMP or PNM) or a header "
            "cut short"
        )
    width, height = size
    if width < 1 or height < 1 or max(width, height) > IMAGE_MAX_SIDE:
        raise UserError(
            f"--image {path}: {width}x{height} pixels; a side must be 1 to {IMAGE_MAX_SIDE}"
        )
    if not image_complete(head, path):
        raise UserError(f"--image {path}: cut short (it lacks its end marker)")


def is_audio(head: bytes) -> bool:
    """WAV, FLAC or MP3 (an ID3 tag, or an MPEG audio frame's sync), as mtmd's helper sniffs."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return True
    if head[:4] == b"fLaC" or head[:3] == b"ID3":
        return True
    return len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0


def image_size(head: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header (JPEG, PNG, GIF, BMP, PNM), or None for
    anything else or a header cut short."""
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24 and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])  # type: ignore[return-value]
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])  # type: ignore[return-value]
    if head[:2] == b"BM" and len(head) >= 26:
        width, height = struct.unpack("<ii", head[18:26])
        return width, abs(height)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(head)
    if head[:2] in (b"P3", b"P5", b"P6"):
        return _pnm_size(head)
    return None


def image_complete(head: bytes, path: Path) -> bool:
    """Does the file end as its format ends (a JPEG's EOI marker, a PNG's IEND chunk)? A decoder
    given one cut short may fill the rest with grey and say nothing."""
    if head[:2] != b"\xff\xd8" and head[:8] != b"\x89PNG\r\n\x1a\n":
        return True
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(0, size - 4096))
        tail = f.read().rstrip(b"\x00")  # (padding after the end marker)
    if head[:2] == b"\xff\xd8":
        return b"\xff\xd9" in tail[-64:]
    return b"IEND" in tail[-64:]


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """The size in a JPEG's first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC)."""
    i = 2
    while i + 4 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", head[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(head):
                return None
            height, width = struct.unpack(">HH", head[i + 5 : i + 9])
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None


def _pnm_size(head: bytes) -> tuple[int, int] | None:
    words: list[int] = []
    for line in head[2:].split(b"\n"):
        for word in line.split(b"#")[0].split():
            if not word.isdigit():
                return None
            words.append(int(word))
            if len(words) == 2:
                return words[0], words[1]
    return None


class Media:
    """mtmd's context for a loaded model and the media it decoded: how many positions a prompt
    with them takes, and its ``evaluate`` into the model. Free it with ``close``."""

    def __init__(
        self, llm: Any, inputs: MediaInputs, n_threads: int, flash_attn: bool | None = None
    ) -> None:
        mtmd_cpp = import_mtmd()
        self._mtmd = mtmd_cpp
        self._llm = llm
        self._bitmaps: list[Any] = []
        assert inputs.mmproj is not None
        quiet_mtmd(mtmd_cpp)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = True
        params.print_timings = False
        params.n_threads = n_threads
        # the encoder's attention as the model's: on, off, or llama.cpp's auto (as its programs
        # pass theirs on)
        params.flash_attn_type = context_defaults.flash_attn_type(flash_attn)
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
