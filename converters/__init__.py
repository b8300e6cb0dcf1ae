"""Pure-Python converters: NDJSON session log -> session model -> writers.

Importable without llama_cpp or a compiler, so a log copied off a server can be converted anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import UserError
from .schema import LEVELS, SCHEMA_VERSIONS

if TYPE_CHECKING:
    from .frames import SessionFrames


def load_session(path: Any, sid: str | None = None, *, strict: bool = False) -> SessionFrames:
    """A session log as pandas DataFrames (see ``converters.frames``); pandas loads on first use."""
    from .frames import load_session as _load

    return _load(path, sid, strict=strict)


__all__ = ["LEVELS", "SCHEMA_VERSIONS", "UserError", "load_session"]
