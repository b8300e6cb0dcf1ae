"""What llama.cpp takes for each choice a context is made with (``context_choices`` names them),
and llama.cpp's own defaults for every context this package opens.

``llama_context_default_params`` and ``common`` (llama-cli, llama-server, llama-bench) open a
context with flash attention ``auto``: llama.cpp turns it on where every device the layers run on
supports the fused op (the CPU does), off elsewhere, and on for a quantized V cache.
llama-cpp-python's ``Llama`` takes flash attention as a bool (on or off); ``opening`` gives the
contexts opened inside it the three-way choice, ``None`` meaning ``auto``. ``flash_attn_type``
(llama.cpp's and mtmd's enum) is the choice's one mapping to the library, and ``kv_type_id`` gives
ggml's id of a KV cache type.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.context_choices import KV_TYPES


def kv_type_id(name: str) -> int:
    """ggml's type id of a KV cache type (llama_context_params' type_k/type_v), or a one-line
    UserError naming the types. The ids are gguf-py's copy of ggml's enum (llama-cpp-python's
    bindings leave out GGML_TYPE_BF16)."""
    from gguf import GGMLQuantizationType

    if name not in KV_TYPES:
        raise UserError(f"unknown KV cache type {name!r}: choose one of {', '.join(KV_TYPES)}")
    return int(GGMLQuantizationType[name.upper()].value)


def flash_attn_type(flash_attn: bool | None) -> int:
    """``enum llama_flash_attn_type`` of the choice (None: auto)."""
    from llama_cpp import llama_cpp as ll

    if flash_attn is None:
        return int(ll.LLAMA_FLASH_ATTN_TYPE_AUTO)
    return int(
        ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )


@contextmanager
def opening(flash_attn: bool | None) -> Iterator[None]:
    """Inside the block, every context llama-cpp-python opens has flash attention as chosen
    (None: auto, llama.cpp's default), whatever its ``Llama(flash_attn=...)`` bool says. Nest it
    inside ``Placement.loading`` (which serializes loads)."""
    from llama_cpp import llama_cpp as ll

    original = ll.llama_init_from_model
    wanted = flash_attn_type(flash_attn)

    def init(model: Any, params: Any) -> Any:
        params.flash_attn_type = wanted
        return original(model, params)

    ll.llama_init_from_model = init
    try:
        yield
    finally:
        ll.llama_init_from_model = original
