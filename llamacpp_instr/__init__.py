"""llamacpp-instr: the bridge between the patched llama.cpp and the converters.

Builds the patched llama-cpp-python wheel, binds the ``llama_instr_*`` C API with ctypes, runs
models with a session open, and provides the ``instr`` command line.
"""

__version__ = "0.1.0"
