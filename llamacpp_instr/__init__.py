"""llamacpp-instr: see inside a real llama.cpp run.

Builds the patched llama-cpp-python wheel, binds the ``llama_instr_*`` C API with ctypes, runs
models with a session open, and provides the ``instr`` command line. The converters (NDJSON log ->
session model -> writers) are ``llamacpp_instr.converters``, importable without llama_cpp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.trace import to_perfetto

__version__ = "0.1.0"

if TYPE_CHECKING:
    from llamacpp_instr.api import InstrSession, record_transfers, session


def __getattr__(name: str) -> Any:
    # the session API (llamacpp_instr/api.py) loads llama_cpp only when it is first used
    if name in ("session", "InstrSession", "record_transfers"):
        import importlib

        return getattr(importlib.import_module("llamacpp_instr.api"), name)
    raise AttributeError(f"module 'llamacpp_instr' has no attribute {name!r}")


__all__ = [
    "InstrSession",
    "__version__",
    "load_session",
    "record_transfers",
    "session",
    "to_perfetto",
]
