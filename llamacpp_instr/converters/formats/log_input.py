"""What the operators' formats (``prometheus``, ``otlp``) take from the rooms below, imported here
and nowhere else: the records' fields and their bounds, a request's slot window and why a prompt
cache missed. The live log itself is followed by ``reading.tail.follow_log``.
"""

from __future__ import annotations

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.reading.decode.fields import MALFORMED, VALUE_MAX, opt_count
from llamacpp_instr.converters.reading.decode.media import is_encode
from llamacpp_instr.converters.reading.decode.steps import step_seqs
from llamacpp_instr.converters.session.request_causes import MISS_REASONS, cache_reason
from llamacpp_instr.converters.session.requests import slot_window

__all__ = [
    "MALFORMED",
    "MISS_REASONS",
    "UserError",
    "VALUE_MAX",
    "cache_reason",
    "is_encode",
    "opt_count",
    "slot_window",
    "step_seqs",
]
