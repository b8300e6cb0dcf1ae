"""llama.cpp's own context defaults for every context this package opens, and the one mapping of
each choice a context is made with: flash attention's three ways and the KV cache's types.

``llama_context_default_params`` and ``common`` (llama-cli, llama-server, llama-bench) open a
context with flash attention ``auto``: llama.cpp turns it on where every device the layers run on
supports the fused op (the CPU does), off elsewhere, and on for a quantized V cache.
llama-cpp-python's ``Llama`` takes flash attention as a bool (on or off); ``opening`` gives the
contexts opened inside it the three-way choice, ``None`` meaning ``auto``. The choice is a
``bool | None`` everywhere; ``flash_attn_type`` (llama.cpp's and mtmd's enum), ``flash_attn_name``
(``-fa on|off|auto``) and ``flash_attn_args`` (``instr run``'s options) are its only spellings.

The KV cache's types are ggml's names (``KV_TYPES``, common's list); ``kv_type_id`` gives ggml's id
of one and ``check_kv`` refuses a setting llama.cpp would: a quantized V cache without flash
attention.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llamacpp_instr.contract.errors import UserError

# llama.cpp's own batch sizes (common.h's common_params, llama_context_default_params): tokens per
# llama_decode call, and per graph compute
LLAMA_N_BATCH = 2048
LLAMA_N_UBATCH = 512

# the KV cache types a context takes (-ctk/-ctv), by ggml's names (the pin's common/arg.cpp)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# the V caches attention reads without flash attention (any other needs it: llama.cpp's rule)
V_WITHOUT_FLASH = ("f32", "f16", "bf16")


def kv_type_id(name: str) -> int:
    """ggml's type id of a KV cache type (llama_context_params' type_k/type_v), or a one-line
    UserError naming the types. The ids are gguf-py's copy of ggml's enum (llama-cpp-python's
    bindings leave out GGML_TYPE_BF16)."""
    from gguf import GGMLQuantizationType

    if name not in KV_TYPES:
        raise UserError(f"unknown KV cache type {name!r}: choose one of {', '.join(KV_TYPES)}")
    return int(GGMLQuantizationType[name.upper()].value)


def check_kv(type_k: str, type_v: str, flash_attn: bool | None) -> None:
    """Refuse, in one line, a KV cache type ggml does not list (``-ctk``/``-ctv``) or a quantized V
    cache with flash attention off (llama.cpp refuses the context)."""
    for flag, name in (("-ctk/--cache-type-k", type_k), ("-ctv/--cache-type-v", type_v)):
        if name not in KV_TYPES:
            raise UserError(f"{flag} must be one of {', '.join(KV_TYPES)}, got {name!r}")
    if type_v not in V_WITHOUT_FLASH and flash_attn is False:
        raise UserError(
            f"a quantized V cache (-ctv {type_v}) needs flash attention (llama.cpp's rule): drop "
            "--no-flash-attn"
        )


def flash_attn_name(flash_attn: bool | None) -> str:
    """llama.cpp's name of the choice (``-fa on|off|auto``)."""
    return "auto" if flash_attn is None else "on" if flash_attn else "off"


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


def flash_attn_args(flash_attn: bool | None) -> list[str]:
    """The ``instr run`` options of the choice: none for auto (the default)."""
    if flash_attn is None:
        return []
    return ["--flash-attn" if flash_attn else "--no-flash-attn"]
