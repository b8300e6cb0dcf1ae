"""Byte rows assembled in bulk: the rows of many groups, each row a length-delimited field (a
tag, the varint of the rest's length, then its group's pieces), all made by one gather from one
source buffer (``Assembly.build``).

A piece is, for every row of its group, a constant, the entry of a ``Table`` picked by a code
per row (strings, track and name heads), the varint of a column of ints (after an entry picked
by the varint's length: a debug annotation's tag, length and name), or 8 bytes of a column (a
float64, a fixed64). Each piece of each row is a (start, length) pair in the source (the
constants, the tables, the varints and the 8-byte values one after another), and the rows are
those runs of the source's bytes one after another (``_gather``).

Assembled group by group, with numpy passes per piece, a flush's begins took several numpy
calls per piece per group: with a few hundred rows a group, most of their cost. Here a piece
costs a few Python appends, and the numpy calls are per assembly and kind of piece.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from .protowire import MORE, spread7, varint_len

_I64 = np.int64
_U8 = np.uint8
MAX_VARINT = 10  # bytes of the longest varint (a uint64)


class Table:
    """Byte strings of values, each value given a code the first time it is met (``codes``):
    kept from one assembly to the next (an entry depends on its value only)."""

    __slots__ = ("index", "entries", "_arrays")

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.entries: list[bytes] = []
        self._arrays: tuple[Any, Any, Any] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def codes(self, values: list[Any], encode: Any) -> Any:
        """Each value's code (int64s), ``encode(value)`` its entry if it is new."""
        index = self.index
        if len(values) > 1:
            try:  # (the usual: every value known; one C call looks them all up)
                return np.fromiter(itemgetter(*values)(index), _I64, len(values))
            except KeyError:
                pass
        for v in dict.fromkeys(values):  # (the new ones, as first met)
            if v not in index:
                index[v] = len(self.entries)
                self.entries.append(encode(v))
        self._arrays = None
        return np.fromiter(map(index.__getitem__, values), _I64, len(values))

    def entry(self, value: Any, encode: Any) -> bytes:
        """The entry of ``value`` (``encode(value)`` if it is new)."""
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.entries)
            self.entries.append(encode(value))
            self._arrays = None
        return self.entries[code]

    def arrays(self) -> tuple[Any, Any, Any]:
        """The entries one after another (uint8s), and each one's start and length."""
        if self._arrays is None or len(self._arrays[2]) != len(self.entries):
            lens = np.fromiter(map(len, self.entries), _I64, len(self.entries))
            blob = np.frombuffer(b"".join(self.entries), dtype=_U8)
            self._arrays = (blob, np.cumsum(lens) - lens, lens)
        return self._arrays


def int_heads(tag: bytes, head: bytes) -> bytes:
    """The entries an int piece picks by its varint's length ``nb`` (1 to 10, each as long):
    ``tag``, the field's length (``head`` and the varint) and ``head``."""
    assert len(tag) == 1 and len(head) + MAX_VARINT < 0x80  # (the length: one byte)
    return b"".join(tag + bytes([len(head) + nb]) + head for nb in range(1, MAX_VARINT + 1))


class Assembly:
    """Groups of rows (``add``), all assembled at once (``build``). A group's pieces, in order:
    ``("c", bytes)`` a constant; ``("t", table, codes)`` a table's entries by code;
    ``("i", heads, ints)`` an ``int_heads`` entry and the varint of each int (int64s);
    ``("8", uint8s)`` 8 bytes per row (an (n, 8) array)."""

    def __init__(self, tag: bytes, scratch: Scratch) -> None:
        self.tag = tag  # each row's tag (one byte), before its length
        self.scratch = scratch
        self.consts: list[bytes] = []  # the source's first part: constants and int heads
        self.const_at: dict[bytes, int] = {}
        self.const_size = 0
        self.slots = 0  # (start, length) pairs so far: a row's pieces one after the other
        self.rows = 0
        self.groups: list[tuple[int, int, int]] = []  # (first slot, rows, slots per row)
        # constants: (first slot, stop, step, where in the source, length)
        self.fixed: list[tuple[int, int, int, int, int]] = []
        # the other pieces by kind: each one's first slot and step (its group's slots per row),
        # its rows, and its values
        self.picks: tuple[list[int], list[int], list[int], list[Any], list[Table]] = (
            [],
            [],
            [],
            [],
            [],
        )
        # (and for ints, where their ``int_heads`` are and the length of each)
        self.ints: tuple[list[int], list[int], list[int], list[Any], list[int], list[int]] = (
            [],
            [],
            [],
            [],
            [],
            [],
        )
        self.eights: tuple[list[int], list[int], list[int], list[Any]] = ([], [], [], [])

    def const(self, data: bytes) -> int:
        """Where ``data`` is in the source (added the first time)."""
        at = self.const_at.get(data)
        if at is None:
            at = self.const_at[data] = self.const_size
            self.consts.append(data)
            self.const_size += len(data)
        return at

    def add(self, n: int, pieces: list[tuple[Any, ...]]) -> int:
        """A group of ``n`` rows made of ``pieces`` (see the class doc); returns its first row's
        index among the assembly's rows."""
        merged: list[tuple[Any, ...]] = []
        for p in pieces:  # (consecutive constants: one piece)
            if p[0] == "c" and merged and merged[-1][0] == "c":
                merged[-1] = ("c", merged[-1][1] + p[1])
            elif p[0] != "c" or p[1]:
                merged.append(p)
        width = 1 + sum(2 if p[0] == "i" else 1 for p in merged)  # (slot 0: the length)
        g0 = self.slots
        stop = g0 + n * width
        self.groups.append((g0, n, width))
        s = g0 + 1
        for p in merged:
            kind = p[0]
            if kind == "c":
                self.fixed.append((s, stop, width, self.const(p[1]), len(p[1])))
            else:
                lists: Any = (
                    self.picks if kind == "t" else self.ints if kind == "i" else self.eights
                )
                lists[0].append(s)
                lists[1].append(width)
                lists[2].append(n)
                lists[3].append(p[2] if kind != "8" else p[1])
                if kind == "t":
                    lists[4].append(p[1])
                elif kind == "i":
                    lists[4].append(self.const(p[1]))
                    lists[5].append(len(p[1]) // MAX_VARINT)
                    s += 1  # (the head's slot, then the varint's)
            s += 1
        self.slots = stop
        r0 = self.rows
        self.rows += n
        return r0

    def build(self) -> tuple[Any, Any, Any]:
        """Every row, one after another: the bytes (uint8s), each row's start and length."""
        starts = np.zeros(self.slots, dtype=_I64)
        lens = np.zeros(self.slots, dtype=_I64)
        parts: list[Any] = [np.frombuffer(b"".join(self.consts), dtype=_U8)]
        base = self.const_size
        for s, stop, step, at, ln in self.fixed:
            starts[s:stop:step] = at
            lens[s:stop:step] = ln
        base = self._picks(starts, lens, parts, base)
        base = self._ints(starts, lens, parts, base)
        base = self._eights(starts, lens, parts, base)
        # each row's first slot: its length (its tag and the varint of the rest's length)
        g0 = [g[0] for g in self.groups]
        ns = [g[1] for g in self.groups]
        firsts = _slots(g0, [g[2] for g in self.groups], ns)
        body = np.add.reduceat(lens, firsts) if len(firsts) else firsts
        nb = varint_len(body)
        w = int(nb.max()) + 1 if len(nb) else 1
        head = np.empty((len(body), w), dtype=_U8)
        head[:, 0] = self.tag[0]
        head[:, 1:] = _varints(body, nb, w - 1)
        starts[firsts] = base + np.arange(len(body), dtype=_I64) * w
        lens[firsts] = nb + 1
        parts.append(head.ravel())
        out = _gather(np.concatenate(parts), starts, lens, self.scratch)
        row_lens = body + nb + 1
        return out, np.cumsum(row_lens) - row_lens, row_lens

    def _picks(self, starts: Any, lens: Any, parts: list[Any], base: int) -> int:
        s0, step, ns, codes, tables = self.picks
        if not s0:
            return base
        where: dict[int, int] = {}  # a table's first entry among all the tables'
        t_starts: list[Any] = []
        t_lens: list[Any] = []
        first: list[int] = []
        entries = 0
        for t in tables:
            e = where.get(id(t))
            if e is None:
                blob, st, ln = t.arrays()
                e = where[id(t)] = entries
                t_starts.append(st + base)
                t_lens.append(ln)
                parts.append(blob)
                base += len(blob)
                entries += len(ln)
            first.append(e)
        slots = _slots(s0, step, ns)
        entry = np.concatenate(codes) + np.repeat(np.array(first, dtype=_I64), ns)
        starts[slots] = np.concatenate(t_starts)[entry]
        lens[slots] = np.concatenate(t_lens)[entry]
        return base

    def _ints(self, starts: Any, lens: Any, parts: list[Any], base: int) -> int:
        s0, step, ns, vals, heads, sizes = self.ints
        if not s0:
            return base
        v = np.concatenate(vals)
        nb = varint_len(v)
        w = int(nb.max())
        parts.append(_varints(v, nb, w).ravel())
        slots = _slots(s0, step, ns)
        # the head: entry nb - 1 of the piece's ``int_heads``, each 2 + len(head) bytes long
        hlen = np.repeat(np.array(sizes, dtype=_I64), ns)
        starts[slots] = np.repeat(np.array(heads, dtype=_I64), ns) + (nb - 1) * hlen
        lens[slots] = hlen
        starts[slots + 1] = base + np.arange(len(v), dtype=_I64) * w
        lens[slots + 1] = nb
        return base + len(v) * w

    def _eights(self, starts: Any, lens: Any, parts: list[Any], base: int) -> int:
        s0, step, ns, vals = self.eights
        if not s0:
            return base
        v = np.concatenate(vals)
        parts.append(v.ravel())
        slots = _slots(s0, step, ns)
        starts[slots] = base + np.arange(len(v), dtype=_I64) * 8
        lens[slots] = 8
        return base + 8 * len(v)


def _slots(s0: list[int], step: list[int], ns: list[int]) -> Any:
    """The slots of pieces (or rows) each ``n`` rows long, from ``s0`` by ``step``: in order."""
    n = np.array(ns, dtype=_I64)
    st = np.array(step, dtype=_I64)
    # (row k of them all, in a piece whose first is row f: s0 + step * (k - f), that is
    # k * step + (s0 - step * f): two repeats, and in place)
    out = np.arange(int(n.sum()), dtype=_I64)
    out *= np.repeat(st, n)
    out += np.repeat(np.array(s0, dtype=_I64) - st * (np.cumsum(n) - n), n)
    return out


class Scratch:
    """A buffer of intps kept from one assembly to the next (``_gather``'s index): memory the
    process has touched already. A new index as long as the rows (megabytes) every time cost
    more in page faults than the gather itself."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = np.zeros(0, dtype=np.intp)

    def get(self, n: int) -> Any:
        if len(self.buf) < n:
            self.buf = np.empty(max(n, 2 * len(self.buf)), dtype=np.intp)
        return self.buf[:n]


def _gather(src: Any, starts: Any, lens: Any, scratch: Scratch) -> Any:
    """``src[starts[k] : starts[k] + lens[k]]`` for each k, one after another. The index of
    each byte is a running sum: 1 from a byte to the next in a piece, a jump between pieces."""
    if not lens.all():  # (an empty piece: no byte of its own to jump at)
        keep = np.flatnonzero(lens)
        starts, lens = starts[keep], lens[keep]
    total = int(lens.sum())
    if not total:
        return np.zeros(0, dtype=_U8)
    step = scratch.get(total)
    step.fill(1)
    at = np.cumsum(lens) - lens
    # (from a piece's last byte to the next one's first)
    step[at[1:]] = starts[1:] - (starts[:-1] + lens[:-1] - 1)
    step[0] = starts[0]
    np.cumsum(step, out=step)
    return src.take(step)


_LOW56 = (1 << 56) - 1


def _varints(v: Any, nb: Any, w: int) -> Any:
    """The varints of ``v`` (int64s, ``nb`` bytes each: ``varint_len``) as a (len(v), w) matrix,
    each varint from the row's start (the bytes after it are not part of it). The first 8
    bytes: the low 56 bits' 7-bit groups spread into a uint64 (``spread7``) and their
    continuation bits set (a view of it); then, where some varint is longer (a value from
    2**56, or a negative one: its two's complement as a uint64), bits 56 to 62 and bit 63."""
    if not len(v):
        return np.zeros((0, w), dtype=_U8)
    y = spread7(v & _LOW56 if w > 8 else v)  # (up to 8 bytes: every value below 2**56)
    y |= MORE[nb]
    low = y.view(_U8).reshape(-1, 8)
    if w <= 8:
        return low[:, :w]
    out = np.empty((len(v), w), dtype=_U8)
    out[:, :8] = low
    ninth = ((v >> 56) & 0x7F).astype(_U8)
    ninth |= (nb == MAX_VARINT).view(_U8) << 7  # (a tenth byte follows)
    out[:, 8] = ninth
    if w > 9:
        out[:, 9] = (v < 0).view(_U8)
    return out
