"""llamacpp-instr: see inside a real llama.cpp run.

Builds the patched llama-cpp-python wheel, binds the ``llama_instr_*`` C API with ctypes, runs
models with a session open, and provides the ``instr`` command line. The converters (NDJSON log ->
session model -> writers) are ``llamacpp_instr.converters``, importable without llama_cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamacpp_instr.contract.version import __version__

if TYPE_CHECKING:
    from llamacpp_instr.converters.analysis.frames import SessionFrames
    from llamacpp_instr.running.api import (
        InstrSession,
        llama_defaults,
        memory_failure,
        record_transfers,
        session,
        set_memory_budget,
    )


def load_session(path: Any, sid: str | None = None, *, strict: bool = False) -> SessionFrames:
    """A session log as pandas DataFrames (``llamacpp_instr.converters.frames``), against this
    machine's peaks (``instr peaks``) when they were measured on the machine that made the log."""
    from llamacpp_instr import converters
    from llamacpp_instr.native.paths import cache_dir

    return converters.load_session(path, sid, strict=strict, peaks_cache=cache_dir())


def to_perfetto(log: str | Path, output: str | Path | None = None, **options: Any) -> Path:
    """Convert a session log to a Perfetto trace and return its path: the options of
    ``llamacpp_instr.converters.formats.convert.to_perfetto`` (fmt, layer, steps, ops, flows, strict,
    peaks, roofline), with the peaks ``instr peaks`` cached on this machine by default."""
    from llamacpp_instr.converters.formats import convert
    from llamacpp_instr.native.paths import cache_dir

    options.setdefault("peaks_cache", cache_dir())
    return convert.to_perfetto(log, output, **options)


# The root imports nothing of its own: `instr` and `import llamacpp_instr` pay only for what they
# use (the CLI's start, and the image's builder, which installs click alone to run `instr build`).
# The session API (running/api.py) loads llama_cpp when first used, the converters numpy and orjson.
_API = (
    "session",
    "InstrSession",
    "llama_defaults",
    "record_transfers",
    "set_memory_budget",
    "memory_failure",
)


def __getattr__(name: str) -> Any:
    import importlib

    if name in _API:
        return getattr(importlib.import_module("llamacpp_instr.running.api"), name)
    if name == "converters":
        return importlib.import_module("llamacpp_instr.converters")
    raise AttributeError(f"module 'llamacpp_instr' has no attribute {name!r}")


__all__ = [
    "InstrSession",
    "__version__",
    "llama_defaults",
    "load_session",
    "memory_failure",
    "record_transfers",
    "session",
    "set_memory_budget",
    "to_perfetto",
]
