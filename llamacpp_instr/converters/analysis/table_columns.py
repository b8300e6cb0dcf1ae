"""The tables' column builders: rows appended to typed arrays (``Table``, with categorical
columns, ``Cat``, in order of first appearance), int64 rows in big chunks (``Chunks``), and the
conversions every table shares."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd


class Cat:
    """A categorical column under construction: codes in an int32 array."""

    def __init__(self) -> None:
        self.codes = array("i")
        self.index: dict[str, int] = {}

    def append(self, value: str | None) -> None:
        if value is None:
            self.codes.append(-1)
            return
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.index)
        self.codes.append(code)

    def series(self) -> pd.Categorical:
        return pd.Categorical.from_codes(self.codes, categories=list(self.index))  # type: ignore[arg-type]


def string_categories(col: pd.Series) -> pd.Series:
    """A categorical column whose (possibly empty) categories are typed as strings, so that an
    all-missing column (steps without a request) stays categorical through Parquet."""
    if len(col.cat.categories):
        return col
    return col.cat.set_categories(pd.Index([], dtype="str"))


def nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 with -1 meaning missing -> nullable Int64 (as ``s.where(s >= 0).astype("Int64")``)."""
    mask = values < 0
    return pd.arrays.IntegerArray(np.where(mask, 1, values), mask)


class Table:
    """Small tables row by row: ints (int64, -1 = missing for nullable ones), floats, categoricals."""

    def __init__(
        self, ints: str = "", floats: str = "", cats: str = "", nullable: str = ""
    ) -> None:
        self.ints = {c: array("q") for c in ints.split()}
        self.floats = {c: array("d") for c in floats.split()}
        self.cats = {c: Cat() for c in cats.split()}
        self.nullable = set(nullable.split())
        self.order = ints.split() + floats.split() + cats.split()

    def add(self, **row: Any) -> None:
        for c, a in self.ints.items():
            v = row[c]
            a.append(-1 if v is None else int(v))
        for c, f in self.floats.items():
            v = row[c]
            f.append(float("nan") if v is None else float(v))
        for c, k in self.cats.items():
            k.append(None if row[c] is None else str(row[c]))

    def frame(self, order: list[str]) -> pd.DataFrame:
        data: dict[str, Any] = {}
        for c, a in self.ints.items():
            s = pd.Series(a, dtype="int64")
            data[c] = s.where(s >= 0).astype("Int64") if c in self.nullable else s
        for c, f in self.floats.items():
            data[c] = pd.Series(f, dtype="float64")
        for c, k in self.cats.items():
            data[c] = k.series()
        return pd.DataFrame({c: data[c] for c in order})


def shape_text(shape: list[int]) -> str:
    return "x".join(map(str, shape))


# --- the session model's steps, as columns ----------------------------------------------------

EMPTY_I64 = np.zeros(0, np.int64)


class Chunks:
    """Rows of three int64 columns, appended in blocks, kept in chunks of 64k rows: big enough
    to be memory-mapped on their own, so freeing them hands the memory back to the system."""

    SIZE = 1 << 16

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.fill = 0  # rows used in the last chunk

    def add(self, block: np.ndarray, offset: int) -> None:
        """Append ``block`` (3, n) as (node position + offset, start, dur)."""
        done, m = 0, block.shape[1]
        while done < m:
            if not self.chunks or self.fill == self.chunks[-1].shape[1]:
                self.chunks.append(np.empty((3, self.SIZE), np.int64))
                self.fill = 0
            ch = self.chunks[-1]
            take = min(m - done, ch.shape[1] - self.fill)
            part = block[:, done : done + take]
            rows = slice(self.fill, self.fill + take)
            np.add(part[0], offset, out=ch[0, rows])
            ch[1, rows] = part[1]
            ch[2, rows] = part[2]
            done += take
            self.fill += take

    def column(self, k: int, dtype: Any = np.int64) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype)
        parts = [ch[k] for ch in self.chunks[:-1]] + [self.chunks[-1][k, : self.fill]]
        return np.concatenate(parts, dtype=dtype, casting="unsafe")


def int_rows(a: array, width: int) -> np.ndarray:
    return np.array(a, np.int64).reshape(-1, width)


def int_column(a: array, dtype: Any = np.int64) -> np.ndarray:
    return np.array(a, dtype)
