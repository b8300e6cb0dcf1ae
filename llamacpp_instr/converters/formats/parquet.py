"""A session's tables as files: one file a table in a directory (``instr export -o DIR``), or
many sessions as one dataset (``instr export --dataset DIR``).

Each table of a session becomes one Parquet file in a hive-partitioned tree,

    DIR/<table>/model=<model>/quant=<file type>/date=<YYYY-MM-DD>/<session id>.parquet

so DuckDB, Polars or Spark query every session exported there, from any machine, with no
conversion: e.g. ``read_parquet('DIR/steps/**/*.parquet', hive_partitioning = true)``. Every row
carries its session id (``sid``); the partition values come from session_start (model name, file
type, the wall-clock date the session began). Exporting a session again replaces its files.
"""

from __future__ import annotations

import re
from pathlib import Path

from llamacpp_instr.contract.errors import UserError

from ..analysis.frames import SessionFrames


def _slug(value: str) -> str:
    """A partition value safe in any filesystem path (hive escapes nothing itself)."""
    s = re.sub(r"[^A-Za-z0-9._+-]+", "_", value.strip()).strip("_")
    return s or "unknown"


def partition(frames: SessionFrames) -> dict[str, str]:
    info = frames.info
    model = str(info.model.get("name") or info.model.get("architecture") or "unknown")
    quant = str(info.model.get("file_type") or "unknown")
    date = (info.wall_time or "")[:10] or "unknown"
    return {"model": _slug(model), "quant": _slug(quant), "date": _slug(date)}


def append_to_dataset(frames: SessionFrames, root: Path) -> list[tuple[Path, int]]:
    """Write (or replace) this session's tables under ``root``; returns (file, rows) per table."""
    parts = partition(frames)
    sub = Path(*(f"{k}={v}" for k, v in parts.items()))
    written = []
    try:
        for name, df in frames.tables().items():
            folder = root / name / sub
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{frames.info.sid}.parquet"
            out = df.copy()
            out.insert(0, "sid", frames.info.sid)
            # write to a temporary name first: a reader never sees a half-written file
            tmp = path.with_suffix(".parquet.partial")
            out.to_parquet(tmp, index=False)
            tmp.replace(path)
            written.append((path, len(out)))
    except OSError as exc:
        raise UserError(f"cannot write to the dataset {root}: {exc.strerror}") from None
    return written


def write_tables(frames: SessionFrames, output: Path, fmt: str) -> list[tuple[Path, int]]:
    """Write this session's tables into the directory ``output``, one ``fmt`` file each (parquet
    or csv); returns (file, rows) per table."""
    written = []
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, df in frames.tables().items():
            path = output / f"{name}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False)
            written.append((path, len(df)))
    except OSError as exc:
        raise UserError(f"cannot write to {output}: {exc.strerror}") from None
    return written
