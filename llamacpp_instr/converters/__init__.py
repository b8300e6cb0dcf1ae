"""Pure-Python converters: NDJSON session log -> session model -> writers.

Importable without llama_cpp or a compiler, so a log copied off a server can be converted anywhere.

One path from a log to every output:

* ``reader`` reads the lines (plain or gzip, damage reported); ``prefetch`` does it on the other
  core for big logs, as a transport for the same decoder;
* ``decode`` says what each record means: the record types (``Graph``, ``Step``, ``Compute``...),
  one decoder per record kind, and the one packer of a compute's ops and layers into columns;
* ``session`` folds the records into sessions and steps, once (``Fold``, run over a file by
  ``iter_events``, or with bulk reading of ops by ``iter_events_packed``; fed line by line by
  ``follow``), every compute's ops as columns, for every consumer: the trace layout
  (``trace_layout``) and
  writers (``perfetto/``, with ``sinks``; ``chrome_json``), ``kv_flows``, and the
  pandas tables of ``frames`` (``load_session``) that ``summary``, ``compare``, ``export`` and
  the reports read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError
from .schema import LEVELS, SCHEMA_VERSIONS

if TYPE_CHECKING:
    from .analysis.frames import SessionFrames


def load_session(
    path: Any, sid: str | None = None, *, strict: bool = False, peaks_cache: Path | None = None
) -> SessionFrames:
    """A session log as pandas DataFrames (see ``converters.frames``); pandas loads on first use.
    ``peaks_cache``: the directory of ``instr peaks``' measurements, to set the ops against the
    roofs of the machine that made the log (``llamacpp_instr.load_session`` gives its own)."""
    from .analysis.frames import load_session as _load

    return _load(path, sid, strict=strict, peaks_cache=peaks_cache)


__all__ = ["LEVELS", "SCHEMA_VERSIONS", "UserError", "load_session"]
