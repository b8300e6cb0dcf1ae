"""Pure-Python converters: NDJSON session log -> session model -> writers.

Importable without llama_cpp or a compiler, so a log copied off a server can be converted anywhere.

One path from a log to every output, one room (subpackage) per job, each importing only the
rooms below it:

* ``reading``: the lines of a log (``reader``: plain or gzip, damage reported; ``prefetch``: on
  the other core for big logs; ``tail``: a log as it is written) and what each record means (``decode``, one module per record
  family, each compute's ops packed into columns);
* ``session``: the records folded into sessions and steps, once (``fold``: ``iter_events``,
  ``iter_events_packed``, ``Fold``), and the figures defined on them once (``derive``,
  ``device_time``, ``kv_flows``, ``requests``, ``machine_peaks``);
* ``traces``: the trace layout (``layout``: tracks, slices and counters);
* ``analysis``: the pandas tables (``frames``: ``load_session``), ``roofline`` and ``follow`` (the live
  view's state);
* ``reports``: the reports (``summary``, ``compare``, ``quant/``...) and their ``renderers``;
* ``formats``: every other output format (Perfetto and Chrome JSON through
  ``convert.to_perfetto``, Parquet, Prometheus, OTLP).

The log's contract (``UserError``, the schema) is ``llamacpp_instr.contract``, below them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import LEVELS, SCHEMA_VERSIONS

if TYPE_CHECKING:
    from .analysis.frames import SessionFrames


def load_session(
    path: Any, sid: str | None = None, *, strict: bool = False, peaks_cache: Path | None = None
) -> SessionFrames:
    """A session log as pandas DataFrames (see ``converters.analysis.frames``); pandas loads on first use.
    ``peaks_cache``: the directory of ``instr peaks``' measurements, to set the ops against the
    roofs of the machine that made the log (``llamacpp_instr.load_session`` gives its own)."""
    from .analysis.frames import load_session as _load

    return _load(path, sid, strict=strict, peaks_cache=peaks_cache)


__all__ = ["LEVELS", "SCHEMA_VERSIONS", "UserError", "load_session"]
