"""The device tables of ``frames_devices`` as DataFrames, from their rows packed in columns
(``device_rows``): device indices named (a categorical over the machine's devices, in its order),
text as categoricals, the other columns typed; and the ``devices`` table itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.sessions import SessionInfo
from ..session import device_time as dt
from .device_rows import TEXT_COLS, Rows

# columns holding device names (categoricals over the machine's devices) and other text
_DEVICE_COLS = {"device", "src", "dst"}


class DeviceFrames:
    """A session's device tables made frames, its devices (``device_time.Devices``) named."""

    def __init__(self, info: SessionInfo, devs: dt.Devices) -> None:
        self.info = info
        self.devs = devs

    def _names(self) -> list[str]:
        return [self.devs[i].name for i in sorted(self.devs.known)]

    def device_column(self, codes: list[np.ndarray], n: int) -> pd.Categorical:
        """Device indices as a categorical of names, in the machine's order."""
        idx = sorted(self.devs.known)
        a = np.concatenate(codes) if codes else np.zeros(0, np.int64)
        assert len(a) == n
        known = np.array(idx, np.int64)
        at = np.minimum(np.searchsorted(known, a), max(len(idx) - 1, 0))
        # each index's position among the machine's (sorted) devices; -1 (no name) if not one
        pos = np.where(known[at] == a, at, -1) if len(idx) else np.full(len(a), -1, np.int64)
        return pd.Categorical.from_codes(pos, categories=self._names())

    def frame(self, cols: list[str], rows: Rows) -> pd.DataFrame:
        """A table of columns ``cols`` from its ``rows``: devices named, text categorical."""
        data = rows.columns()  # (typed: pandas' inference over rows cost more)
        out: dict[str, Any] = {}
        for c, v in zip(cols, data, strict=True):
            if c in _DEVICE_COLS:
                out[c] = self.device_column([np.asarray(v, dtype=np.int64)], len(v))
            elif c in TEXT_COLS:
                out[c] = _categorical(v, list(rows.codes[c]))
            elif c == "timed":
                out[c] = np.asarray(v, dtype=bool)
            elif c == "share":
                out[c] = np.asarray(v, dtype=np.float64)
            else:
                out[c] = np.asarray(v, dtype=np.int64)
        df = pd.DataFrame(out, columns=cols)
        if "step" in cols:
            df["step"] = df["step"].where(df["step"] >= 0).astype("Int64")
        return df

    def devices(self) -> pd.DataFrame:
        """The ``devices`` table: the machine's devices, in its order."""
        rows = []
        listed = self.info.machine.get("devices") or []
        for i in sorted(self.devs.known):
            d = self.devs[i]
            raw = next((x for x in listed if isinstance(x, dict) and x.get("index") == i), {})
            mem = raw.get("memory_total")
            rows.append(
                {
                    "device": d.name,
                    "index": i,
                    "backend": d.backend,
                    "description": d.description,
                    "type": d.type,
                    "remote_timing": d.remote_timing,
                    "memory_total": mem if type(mem) is int else None,
                }
            )
        df = pd.DataFrame(rows)
        df["remote_timing"] = df["remote_timing"].astype("boolean")
        df["memory_total"] = df["memory_total"].astype("Int64")
        return df


def _categorical(codes: np.ndarray, names: list[str]) -> Any:
    """Text held as codes (``device_rows.Codes``: ``names`` in code order) as a categorical,
    its categories sorted, as ``astype("category")`` makes them of the text."""
    if not names:
        return pd.Series([], dtype=object).astype("category")
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), np.int64)
    rank[order] = np.arange(len(names))
    return pd.Categorical.from_codes(rank[codes], categories=[names[k] for k in order])
