"""Always on: what bounds a session's cost and size, as ``run``, ``serve``, ``exec`` and
the API take it.

* sampling: ``sample`` — one decode step in N at the chosen level, the others at minimal;
  ``sample_requests`` — the steps of one request in N (a server's requests) at the level;
* bounded files: ``max_bytes`` — rotate the log at this size (LOG -> LOG.1 -> ... LOG.keep, a new
  LOG that reads alone), keeping ``keep`` older files.

The same settings reach the native library three ways: ``apply`` (the C API, before a session
opened here begins), ``env`` (the variables a session opened by LLAMA_INSTR_LOG reads: ``instr
exec``), and ``metadata``. SIGHUP reopens the log in every long-running command.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError

# the native library's limits (llama_instr_set_sampling, llama_instr_set_rotation)
MIN_MAX_BYTES = 64 * 1024
MAX_KEEP = 1000
MAX_SAMPLE = 1_000_000
DEFAULT_KEEP = 8

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*$")
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30}


def parse_size(text: str) -> int:
    """Bytes from ``text``: a number with an optional K, M or G suffix (KiB, MiB, GiB): "64M"."""
    m = _SIZE.match(text)
    if not m:
        raise UserError(f"not a size: {text!r} (bytes, or with a K, M or G suffix: 64M)")
    return int(m.group(1)) << _SHIFT[m.group(2).lower()]


@dataclass(frozen=True)
class AlwaysOn:
    """Sampling and bounded files for one session (the defaults: every step in detail, one file)."""

    sample: int = 1
    sample_requests: int = 1
    max_bytes: int = 0
    keep: int = 0

    def __post_init__(self) -> None:
        for name, v in (("--sample", self.sample), ("--sample-requests", self.sample_requests)):
            if not 1 <= v <= MAX_SAMPLE:
                raise UserError(f"{name} must be between 1 and {MAX_SAMPLE}, got {v}")
        if self.max_bytes == 0:
            if self.keep:
                raise UserError("--keep needs --max-bytes (the size at which the log rotates)")
        elif self.max_bytes < MIN_MAX_BYTES:
            raise UserError(f"--max-bytes must be at least 64K, got {self.max_bytes}")
        elif not 1 <= self.keep <= MAX_KEEP:
            raise UserError(f"--keep must be between 1 and {MAX_KEEP}, got {self.keep}")

    @classmethod
    def of(
        cls, sample: int = 1, sample_requests: int = 1, max_bytes: int = 0, keep: int | None = None
    ) -> AlwaysOn:
        """The settings as the options give them: ``keep`` defaults to 8 with ``max_bytes``."""
        if keep is None:
            keep = DEFAULT_KEEP if max_bytes else 0
        return cls(sample, sample_requests, max_bytes, keep)

    @property
    def active(self) -> bool:
        return self != AlwaysOn()

    def apply(self, api: Any) -> None:
        """Set them for the next session the library opens (``bindings.InstrLib``)."""
        api.set_sampling(self.sample, self.sample_requests)
        api.set_rotation(self.max_bytes, self.keep)

    def env(self) -> dict[str, str]:
        """The variables a session opened by LLAMA_INSTR_LOG reads (only those that are set)."""
        out: dict[str, str] = {}
        if self.sample > 1:
            out["LLAMA_INSTR_SAMPLE"] = str(self.sample)
        if self.sample_requests > 1:
            out["LLAMA_INSTR_SAMPLE_REQUESTS"] = str(self.sample_requests)
        if self.max_bytes:
            out["LLAMA_INSTR_MAX_BYTES"] = str(self.max_bytes)
            out["LLAMA_INSTR_KEEP"] = str(self.keep)
        return out

    def describe(self) -> str:
        """What a command says about them on stderr ("" for the defaults)."""
        parts = []
        if self.sample > 1:
            parts.append(f"1 step in {self.sample} in detail")
        if self.sample_requests > 1:
            parts.append(f"1 request in {self.sample_requests} in detail")
        if self.max_bytes:
            parts.append(f"rotated at {self.max_bytes} bytes, {self.keep} kept")
        return ", ".join(parts)

    def metadata(self) -> dict[str, Any]:
        return asdict(self)
