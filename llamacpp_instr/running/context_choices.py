"""The choices a context is made with, as this package names them: llama.cpp's own batch sizes,
flash attention's three ways and the KV cache's types, and the settings llama.cpp refuses.

Data alone (the planners read it): flash attention is a ``bool | None`` everywhere, ``None``
meaning llama.cpp's ``auto``; ``flash_attn_name`` (``-fa on|off|auto``) and ``flash_attn_args``
(``instr run``'s options) are its spellings here. The KV cache's types are ggml's names
(``KV_TYPES``, common's list); ``check_kv`` refuses a setting llama.cpp would: a quantized V cache
without flash attention. What llama.cpp itself takes for them (its enum, ggml's type ids) and the
contexts opened with them are ``context_defaults``'.
"""

from __future__ import annotations

from llamacpp_instr.contract.errors import UserError

# llama.cpp's own batch sizes (common.h's common_params, llama_context_default_params): tokens per
# llama_decode call, and per graph compute
LLAMA_N_BATCH = 2048
LLAMA_N_UBATCH = 512

# the KV cache types a context takes (-ctk/-ctv), by ggml's names (the pin's common/arg.cpp)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# the V caches attention reads without flash attention (any other needs it: llama.cpp's rule)
V_WITHOUT_FLASH = ("f32", "f16", "bf16")


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


def flash_attn_args(flash_attn: bool | None) -> list[str]:
    """The ``instr run`` options of the choice: none for auto (the default)."""
    if flash_attn is None:
        return []
    return ["--flash-attn" if flash_attn else "--no-flash-attn"]
