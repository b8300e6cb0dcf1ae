"""Pure-Python converters: NDJSON session log -> session model -> writers.

Importable without llama_cpp or a compiler, so a log copied off a server can be converted anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from converters.errors import UserError

SCHEMA_VERSIONS = (1,)

if TYPE_CHECKING:
    from converters.frames import SessionFrames


def load_session(path: Any, sid: str | None = None, *, strict: bool = False) -> SessionFrames:
    """A session log as pandas DataFrames (see ``converters.frames``); pandas loads on first use."""
    from converters.frames import load_session as _load

    return _load(path, sid, strict=strict)


__all__ = ["UserError", "SCHEMA_VERSIONS", "load_session"]
