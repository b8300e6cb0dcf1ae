"""llama.cpp's own sampling counters, on for the sampler chains llama-cpp-python makes in a session.

llama-cpp-python makes its chains with ``llama_sampler_chain_default_params()``, whose
``no_perf`` is true: llama.cpp then keeps no time for them, and ``llama_perf_sampler(chain)`` says
0. In a session the chains it makes count their time (``no_perf`` false), so that each chain's
``chain`` record carries llama.cpp's own measure of its sampling beside the log's (docs/schema.md).
It changes no result: the counter is two clock reads per apply and accept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from llamacpp_instr.native import bindings


@contextmanager
def counting() -> Iterator[None]:
    """While the block runs, the chains llama-cpp-python makes count their time."""
    module = bindings.import_llama_cpp().llama_cpp
    default: Callable[[], Any] = module.llama_sampler_chain_default_params

    def with_counters() -> Any:
        params = default()
        params.no_perf = False
        return params

    module.llama_sampler_chain_default_params = with_counters
    try:
        yield
    finally:
        if module.llama_sampler_chain_default_params is with_counters:
            module.llama_sampler_chain_default_params = default
