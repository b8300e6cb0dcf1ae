"""Byte strings made in bulk: many rows, each the same sequence of pieces, assembled with numpy.

A piece is, for every row, a constant, a varint of a column of non-negative integers, a float64
of a column (little-endian: a fixed64 field's value), or one of a few byte strings picked by a
code per row (strings, track ids, interned names). ``Pieces.build`` writes every row one after
another in one buffer; ``Pieces.lengths`` gives each row's length first (for a length prefix).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .protowire import varint_len
from .singles import put_const, put_varints

_U8 = np.uint8


class Pieces:
    """The pieces of ``n`` rows (see the module doc), in the order they were added."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[tuple[str, Any, Any]] = []  # (kind, data, per-row lengths or a size)

    def const(self, data: bytes) -> None:
        if not data:
            return
        if self.parts and self.parts[-1][0] == "const":  # (one write for both)
            data = self.parts.pop()[1] + data
        self.parts.append(("const", data, len(data)))

    def varint(self, v: Any) -> None:
        """Varints of ``v`` (int64, all >= 0)."""
        self.parts.append(("varint", v, varint_len(v)))

    def f64(self, v: Any) -> None:
        self.parts.append(("f64", np.ascontiguousarray(v, dtype="<f8"), 8))

    def fixed64(self, v: Any) -> None:
        """Little-endian uint64s of ``v`` (a fixed64 field's value)."""
        self.parts.append(("f64", np.ascontiguousarray(v, dtype="<u8"), 8))

    def annotations(self, tag: bytes, heads: list[bytes], v: Any) -> None:
        """Per row, for each of ``heads`` (its row ``j`` of ``v``: int64, all >= 0, below 2**63)
        a length-delimited field ``tag LEN head varint(v[j])``: the debug annotations of a run of
        int args, all at once (``tag`` one byte, each head under 100: LEN is one byte)."""
        nb = varint_len(v)
        h = np.array([len(x) for x in heads], dtype=np.int64)
        size = 2 + h[:, None] + nb  # (args, rows)
        self.parts.append(("ann", (tag, heads, h, v, nb, size), size.sum(axis=0)))

    def pick(self, codes: Any, values: list[bytes]) -> None:
        """Per row, ``values[codes[row]]``."""
        vl = np.array([len(x) for x in values], dtype=np.int64)
        mat = np.zeros((len(values), max(1, int(vl.max()) if len(vl) else 1)), dtype=_U8)
        for k, x in enumerate(values):
            mat[k, : len(x)] = np.frombuffer(x, dtype=_U8)
        self.parts.append(("pick", (codes, mat), vl[codes]))

    def lengths(self) -> Any:
        total = np.zeros(self.n, dtype=np.int64)
        for _, _, ln in self.parts:
            total += ln
        return total

    def build(self) -> tuple[Any, Any]:
        """All the rows in one buffer, and each row's length."""
        lens = self.lengths()
        out = np.empty(int(lens.sum()), dtype=_U8)
        at = np.cumsum(lens) - lens
        end = at + lens  # each row's end
        for kind, data, ln in self.parts:
            if kind == "const":
                put_const(out, at, data)
            elif kind == "varint":
                put_varints(out, at, data, ln)
            elif kind == "ann":
                _annotations(out, at, *data)
            elif kind == "f64":
                out[at[:, None] + np.arange(8)] = data.view(_U8).reshape(-1, 8)
            else:
                codes, mat = data
                _pick(out, at, end, codes, mat, ln)
            at = at + ln
        return out, lens


def _pick(out: Any, at: Any, end: Any, codes: Any, mat: Any, ln: Any) -> None:
    """A pick's values (``mat``'s rows by ``codes``, ``ln`` bytes each) at ``at``, the rows
    ending at ``end``."""
    w = mat.shape[1]
    fits = end - at >= w if w <= 64 else np.zeros(len(at), dtype=bool)
    if fits.all():
        # each row's value padded to the longest: the padding lands on the row's later parts,
        # written after this one (cheaper than placing each byte)
        out[at[:, None] + np.arange(w)] = mat[codes]
        return
    if fits.any():  # (the rows with room for it so, the others byte by byte)
        f = np.flatnonzero(fits)
        out[at[f][:, None] + np.arange(w)] = mat[codes[f]]
        rest = np.flatnonzero(~fits)
        at, codes, ln = at[rest], codes[rest], ln[rest]
    within = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)
    out[np.repeat(at, ln) + within] = mat[np.repeat(codes, ln), within]


def _annotations(
    out: Any, at: Any, tag: bytes, heads: list[bytes], h: Any, v: Any, nb: Any, size: Any
) -> None:
    """``Pieces.annotations``' bytes, the rows starting at ``at``."""
    off = at[None, :] + (np.cumsum(size, axis=0) - size)  # each field's start
    out[off] = tag[0]
    out[off + 1] = (h[:, None] + nb).astype(_U8)
    # the heads' bytes: each byte's field (arg) and place in its head, for every row at once
    hb = np.frombuffer(b"".join(heads), dtype=_U8)
    arg = np.repeat(np.arange(len(heads)), h)
    within = np.arange(len(hb)) - np.repeat(np.cumsum(h) - h, h)
    out[off[arg, :] + (2 + within)[:, None]] = hb[:, None]
    put_varints(out, (off + 2 + h[:, None]).ravel(), v.ravel(), nb.ravel())
