"""The device tables' rows as they come, packed into typed columns (``frames_devices``): ``Rows``
takes a tuple per row; ``KeyedRows`` takes the decoder's own rows (``Split``, ``Copy``, ``Busy``,
``Remote``, ``TransferRow``, or the raw rows of a record they were not made of) a list at a time
with the keys they share (step and ubatch, or phase and step, then the offset to add to their
times), made columns only when packed (``PACK_ROWS``), the whole batch at once."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

# columns of text (the rest: int64, but ``timed``, bool, and ``share``, float64)
TEXT_COLS = {"tensor", "cmd", "phase", "kind"}

# rows a table holds as Python objects before they are packed into its columns: few, so that
# they die young (rows held for thousands of steps kept the cyclic collector busy: on a 200k-op
# RPC log ~190 collections and a full one, against 20 for a CPU log; bench/convert.py)
PACK_ROWS = 128


class Rows:
    """A table's rows as they come (tuples), packed into typed columns every ``PACK_ROWS``:
    a tuple of Python ints costs several times the memory of its values in arrays, and a long
    run holds a few rows per step of each table."""

    def __init__(self, cols: list[str]) -> None:
        self.cols = cols
        self.rows: list[tuple[Any, ...]] = []
        self.packed: list[list[Any]] = [[] for _ in cols]  # per column, its packed chunks
        # per text column, its values' codes in order of first appearance (the column: codes)
        self.codes: dict[str, Codes] = {c: Codes() for c in cols if c in TEXT_COLS}

    def append(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= PACK_ROWS:
            self.pack()

    def extend(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows += rows
        if len(self.rows) >= PACK_ROWS:
            self.pack()

    def pack(self) -> None:
        if not self.rows:
            return
        cols = zip(*self.rows, strict=True)
        for name, chunks, col in zip(self.cols, self.packed, cols, strict=True):
            chunks.append(self._column(name, col))
        self.rows = []

    def then(self, other: Rows) -> None:
        """``other``'s rows after these."""
        self.pack()
        other.pack()
        for name, mine, theirs in zip(self.cols, self.packed, other.packed, strict=True):
            if name in self.codes and theirs:  # (their codes, as ours)
                lut = self._column(name, other.codes[name])
                theirs = [lut[x] for x in theirs]
            mine += theirs

    def put(self, columns: dict[str, Any]) -> None:
        """Rows given as columns (typed as ``_column`` makes them; text: a list), after these."""
        self.pack()
        for name, chunks in zip(self.cols, self.packed, strict=True):
            v = columns[name]
            chunks.append(self._column(name, v) if name in self.codes else v)

    def columns(self) -> list[Any]:
        """Each column whole (an array; text: its codes, ``codes``; kept whole for the next
        call)."""
        self.pack()
        out = [
            self._column(name, []) if not chunks
            else chunks[0] if len(chunks) == 1
            else np.concatenate(chunks)
            for name, chunks in zip(self.cols, self.packed, strict=True)
        ]  # fmt: skip
        self.packed = [[c] for c in out]
        return out

    def _column(self, name: str, values: Any) -> Any:
        """A column's values, typed as the table holds them (text: codes, an int32 array)."""
        codes = self.codes.get(name)
        if codes is None:
            return _column(name, values)
        return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values))

    def column(self, name: str) -> Any:
        return self.columns()[self.cols.index(name)]


def keys_array(a: array, width: int) -> np.ndarray:
    """Keys kept ``width`` to a row in an ``array("q")``, as an (n, width) int64 array."""
    return (
        np.frombuffer(a, dtype=np.int64).reshape(-1, width)
        if len(a)
        else np.zeros((0, width), np.int64)
    )


class Codes(dict[str, int]):
    """Text values' codes, each value's the next free one when first met: a column of text is
    held as int32 codes (a long run sends the same few command and tensor names over and
    over: one string object per row cost some 60 bytes)."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


def _column(name: str, values: Any) -> Any:
    """A column's values, typed as its table holds them (text: ``Rows._column``)."""
    if name == "timed":
        return np.asarray(values, dtype=bool)
    if name == "share":
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values, dtype=np.int64)


# a keyed table's columns from its batch: the keys of each list and its length, and the rows
Make = Callable[[list[tuple[Any, ...]], list[int], list[Any]], list[Any]]


class KeyedRows(Rows):
    """A table whose rows come a list at a time, the rows of one list sharing their leading
    columns (``keys``): the lists are kept as the decoder made them (no tuple per row is built)
    and ``make`` turns a batch of them into the table's columns at once."""

    def __init__(self, cols: list[str], make: Make) -> None:
        super().__init__(cols)
        self.make = make
        self.keys: list[tuple[Any, ...]] = []
        self.counts: list[int] = []

    def add(self, keys: tuple[Any, ...], rows: list[Any]) -> None:
        if not rows:
            return
        self.keys.append(keys)
        self.counts.append(len(rows))
        self.extend(rows)  # packs through this class's pack, keys and counts with the rows

    def add_lists(self, keys: list[tuple[Any, ...]], lists: list[list[Any]]) -> None:
        """Several lists at once, each with its keys (``add`` of each; an empty list adds no
        row, its keys no column value)."""
        self.keys += keys
        self.counts += map(len, lists)
        self.extend(list(chain.from_iterable(lists)))

    def pack(self) -> None:
        if not self.rows:
            return
        made = self.make(self.keys, self.counts, self.rows)
        for name, chunks, col in zip(self.cols, self.packed, made, strict=True):
            if isinstance(col, Runs):  # (text the same for each list's rows: coded per list)
                col = np.repeat(self._column(name, col.values), col.counts)
            elif name in self.codes:
                col = self._column(name, col)
            chunks.append(col)
        self.rows, self.keys, self.counts = [], [], []


class Runs(NamedTuple):
    """A text column whose value is the same for all the rows of each list (``make``'s):
    the lists' values and row counts."""

    values: list[str]
    counts: list[int]


def _ints(rows: list[Any], width: int) -> np.ndarray:
    """Rows of ``width`` ints as an (n, width) int64 array (read in one pass, ``fromiter``:
    quicker than ``np.array`` working out the shape of nested lists; the rows are the
    decoder's, each of its width)."""
    n = len(rows) * width
    return np.fromiter(chain.from_iterable(rows), np.int64, count=n).reshape(-1, width)


def _fields(fields: list[Any], n: int) -> np.ndarray:
    """Fields of ``n`` ints each (tuples, from ``zip``) as a (fields, n) int64 array."""
    return np.fromiter(chain.from_iterable(fields), np.int64, count=len(fields) * n).reshape(-1, n)


def _keys(keys: list[tuple[Any, ...]], counts: list[int], first: int = 0) -> np.ndarray:
    """Each row's keys (ints, from the ``first``): an (n, width) int64 array."""
    k = keys if not first else [x[first:] for x in keys]
    return np.repeat(_ints(k, len(k[0])), counts, axis=0)


def make_splits(keys: list[tuple[Any, ...]], counts: list[int], rows: list[Any]) -> list[Any]:
    """step ubatch split device node_start node_end t_start t_launch t_end inputs_ns launch_ns,
    from ``Split`` rows (each list: one compute's, the split its position)."""
    a = _ints(rows, 6)
    k = _keys(keys, counts)
    a[:, 3:] += k[:, 2:]
    n = np.array(counts, dtype=np.int64)
    split = np.arange(len(a), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return [k[:, 0], k[:, 1], split, *a.T, a[:, 4] - a[:, 3], a[:, 5] - a[:, 4]]


def make_copies(keys: list[tuple[Any, ...]], counts: list[int], rows: list[Any]) -> list[Any]:
    """step ubatch split node tensor bytes src dst t_start dur_ns, from ``Copy`` rows."""
    k_, node, name, nbytes, src, dst, s, d = zip(*rows, strict=True)  # (each field, in C)
    a = _fields([k_, node, nbytes, src, dst, s, d], len(rows))
    k = _keys(keys, counts)
    a[5] += k[:, 2]
    return [k[:, 0], k[:, 1], *a[:2], name, *a[2:]]


def make_busy(keys: list[tuple[Any, ...]], counts: list[int], rows: list[Any]) -> list[Any]:
    """step ubatch device split n_ops t_start dur_ns, from ``Busy`` rows."""
    a = _ints(rows, 5)
    k = _keys(keys, counts)
    a[:, 1] += k[:, 2]
    return [k[:, 0], k[:, 1], a[:, 0], a[:, 3], a[:, 4], a[:, 1], a[:, 2]]


def make_remote(keys: list[tuple[Any, ...]], counts: list[int], rows: list[Any]) -> list[Any]:
    """step ubatch split device t_send t_reply t_start t_end dur_ns one_way_ns err_ns
    clock_offset_ns bytes n_ops, from ``Remote`` rows."""
    a = _ints(rows, 11)
    k = _keys(keys, counts)
    a[:, 2:6] += k[:, 2:]
    return [k[:, 0], k[:, 1], *a[:, :6].T, a[:, 5] - a[:, 4], *a[:, 6:].T]


def make_transfers(keys: list[tuple[Any, ...]], counts: list[int], rows: list[Any]) -> list[Any]:
    """phase step device cmd tensor bytes sent recv t_queue t_start t_sent t_end dur_ns, from
    ``TransferRow`` rows or a record's raw rows (each list: a record's, its phase, its step and
    the offset of its times the keys)."""
    d, cmd, tensor, *ints = zip(*rows, strict=True)  # (each field, in C)
    a = _fields([d, *ints], len(rows))  # device bytes sent recv queue start sent_at end
    k = _keys(keys, counts, 1)
    a[4:] += k[:, 1]
    phase = Runs([x[0] for x in keys], counts)
    return [phase, k[:, 0], a[0], cmd, tensor, *a[1:], a[7] - a[5]]
