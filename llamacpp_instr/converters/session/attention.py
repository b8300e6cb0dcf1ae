"""Flash attention in a session: what llama.cpp used (the ``context`` record's ``flash_attn``,
after its ``auto`` was resolved) and what was asked of it, from the session's metadata: ``instr
run``'s ``flash_attn_type``, or the ``-fa``/``--flash-attn`` of a llama.cpp program's command
line (``argv``, a session opened by ``LLAMA_INSTR_LOG``; none given is llama.cpp's default,
``auto``). A session opened through the API around the caller's own ``Llama`` says only what was
used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamacpp_instr.converters.reading.decode.sessions import SessionInfo

ASKED = ("auto", "on", "off")
# the command-line words read for -fa (a log's argv is foreign: bounded)
MAX_ARGV = 4096
_WORDS = {
    "auto": "auto",
    "on": "on",
    "1": "on",
    "true": "on",
    "off": "off",
    "0": "off",
    "false": "off",
}


@dataclass(frozen=True)
class FlashAttention:
    used: bool | None  # None: the log has no context record
    asked: str | None  # "auto", "on", "off"; None: not said (an API session)

    def line(self) -> str:
        """The summary's fact: what was used, and who decided it."""
        if self.used is None:
            return "not recorded"
        used = "on" if self.used else "off"
        if self.asked == "auto":
            why = "every device supports it" if self.used else "a device lacks it"
            return f"{used} (decided by auto, llama.cpp's default: {why})"
        if self.asked == "off":
            return f"{used} (asked: attention as separate KQ, soft_max and KQV ops)"
        if self.asked == "on":
            return f"{used} (asked)"
        return used

    def to_json(self) -> dict[str, Any]:
        return {"used": self.used, "asked": self.asked}


def flash_attention(info: SessionInfo) -> FlashAttention:
    used = info.context.get("flash_attn") if isinstance(info.context, dict) else None
    return FlashAttention(used if isinstance(used, bool) else None, asked(info.metadata))


def asked(meta: Any) -> str | None:
    """What the session's opener asked (module doc); None where it does not say."""
    if not isinstance(meta, dict):
        return None
    given = meta.get("flash_attn_type")
    if isinstance(given, str) and given in ASKED:
        return given
    argv = meta.get("argv")
    if not isinstance(argv, list):
        return None
    words = [w for w in argv[:MAX_ARGV] if isinstance(w, str)]
    said = "auto"  # llama.cpp's default
    for i, w in enumerate(words):
        if w in ("-fa", "--flash-attn") and i + 1 < len(words):
            said = _WORDS.get(words[i + 1].lower(), said)
        elif w.startswith("--flash-attn="):
            said = _WORDS.get(w.split("=", 1)[1].lower(), said)
    return said
