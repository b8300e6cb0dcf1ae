"""llama.cpp's own context defaults for every context this package opens.

``llama_context_default_params`` and ``common`` (llama-cli, llama-server, llama-bench) open a
context with flash attention ``auto``: llama.cpp turns it on where every device the layers run on
supports the fused op (the CPU does), off elsewhere, and on for a quantized V cache.
llama-cpp-python's ``Llama`` takes flash attention as a bool (on or off); ``opening`` gives the
contexts opened inside it the three-way choice, ``None`` meaning ``auto``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


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
