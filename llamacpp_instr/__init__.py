"""llamacpp-instr: see inside a real llama.cpp run.

Builds the patched llama-cpp-python wheel, binds the ``llama_instr_*`` C API with ctypes, runs
models with a session open, and provides the ``instr`` command line. The converters (NDJSON log ->
session model -> writers) are ``llamacpp_instr.converters``, importable without llama_cpp.
"""

from llamacpp_instr.converters import load_session

__version__ = "0.1.0"

__all__ = ["__version__", "load_session"]
