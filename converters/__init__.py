"""Pure-Python converters: NDJSON session log -> session model -> writers.

Importable without llama_cpp or a compiler, so a log copied off a server can be converted anywhere.
"""

from converters.errors import UserError

SCHEMA_VERSIONS = (1,)

__all__ = ["UserError", "SCHEMA_VERSIONS"]
