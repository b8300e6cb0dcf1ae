"""Images and sounds (tools/mtmd): ``media`` records, an encoder's encodes (``Encode``: a
``step_begin`` of kind ``encode`` and what follows it to its ``step_end``), and the medium a
decode step decodes.

Each is checked here once; a record without the schema's shape raises one of
``fields.MALFORMED`` and is skipped as every damaged record is. A session's media are kept as
columns of integers (``MediaTable``: the fields the schema names, the hash too), so that a medium
costs a reader less than its line does.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .fields import VALUE_MAX, nonneg, opt_count, uint
from .passes import Pass, begun

KINDS = ("image", "audio")  # a medium's kind; another is kept as "other"
# a session's media kept at most (the later ones are counted, not kept)
MAX_MEDIA = 1 << 20
# the medium slices an encode's step_begin names at most (the writer's bound: the rest are
# counted in its ``media_more``)
MAX_ENCODE_SLICES = 64


@dataclass(frozen=True, slots=True)
class Medium:
    """One ``media`` record: an image or a sound mtmd tokenized (never its pixels or samples)."""

    id: int
    ts: int
    kind: str  # image, audio (or other: a kind this reader does not know)
    nx: int  # width in pixels; a sound's samples
    ny: int  # height in pixels; 1 for a sound
    frames: int  # bitmaps merged into it (0: one)
    bytes: int
    hash: int  # the 64-bit hash of its bytes, signed (``hash_text`` writes it as the log does)
    slices: int  # encoder inputs it became
    tokens: int  # embeddings it costs the model
    n_pos: int  # positions they take
    t_load: int  # its load (decoding from its file or bytes): start and ns; -1, 0 when not said
    load_ns: int
    t_preprocess: int  # its preprocessing and tokenizing: start and ns; -1, 0 when not said
    preprocess_ns: int

    @property
    def hash_text(self) -> str:
        return (self.hash & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big").hex()


class MediaTable:
    """A session's media, in log order: a column of 64-bit integers per field of ``Medium``
    (its kind as an index into ``KINDS``, 2 for other), at most ``MAX_MEDIA`` (the rest counted
    in ``dropped``); ``table[i]`` is the i-th as a ``Medium``."""

    FIELDS = tuple(Medium.__dataclass_fields__)

    def __init__(self) -> None:
        self.cols = {f: array("q") for f in self.FIELDS}
        self.dropped = 0

    def add(self, m: Medium) -> None:
        if len(self) >= MAX_MEDIA:
            self.dropped += 1
            return
        for f, col in self.cols.items():
            v = getattr(m, f)
            col.append(_KIND_CODES.get(v, 2) if f == "kind" else v)

    def __len__(self) -> int:
        return len(self.cols["id"])

    def __getitem__(self, i: int) -> Medium:
        vals: dict[str, Any] = {f: col[i] for f, col in self.cols.items()}
        vals["kind"] = (*KINDS, "other")[vals["kind"]]
        return Medium(**vals)

    def __iter__(self) -> Iterator[Medium]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MediaTable)
            and self.cols == other.cols
            and self.dropped == other.dropped
        )

    def column(self, field: str) -> np.ndarray:
        """A field's values (int64, a view of the column: no copy)."""
        col = self.cols[field]
        return np.frombuffer(col, np.int64) if len(col) else np.zeros(0, np.int64)


_KIND_CODES = {k: i for i, k in enumerate(KINDS)}


def _span(v: Any, name: str) -> tuple[int, int]:
    """A ``[t_start, dur]`` pair, or (-1, 0) when absent."""
    if v is None:
        return -1, 0
    if type(v) is not list or len(v) != 2:
        raise ValueError(f"{name} is not a [t_start, dur] pair")
    return nonneg(v[0]), nonneg(v[1])


def medium_record(rec: dict[str, Any]) -> Medium:
    """A ``media`` record, checked (else ValueError or TypeError: the record is skipped)."""
    kind = rec["kind"]
    if type(kind) is not str:
        raise TypeError("kind is not a string")
    h = rec["hash"]
    if type(h) is not str or len(h) != 16 or h.strip("0123456789abcdef"):
        raise ValueError("hash is not 16 hex digits")
    t_load, load_ns = _span(rec.get("load"), "load")
    t_pre, pre_ns = _span(rec.get("preprocess"), "preprocess")

    def count(k: str) -> int:
        v = opt_count(rec[k])
        if v is None:
            raise ValueError(f"{k} is null")
        return v

    return Medium(
        id=uint(rec["id"], 1),
        ts=nonneg(rec["ts"]),
        kind=kind if kind in KINDS else "other",
        nx=count("nx"),
        ny=count("ny"),
        frames=opt_count(rec.get("frames")) or 0,
        bytes=count("bytes"),
        hash=_signed(int(h, 16)),
        slices=count("slices"),
        tokens=count("tokens"),
        n_pos=count("n_pos"),
        t_load=t_load,
        load_ns=load_ns,
        t_preprocess=t_pre,
        preprocess_ns=pre_ns,
    )


def _signed(v: int) -> int:
    """A 64-bit hash as a signed 64-bit integer (the columns' type)."""
    return v - (1 << 64) if v >= 1 << 63 else v


ENCODE = "encode"  # a step_begin's kind for an encoder's encode


def is_encode(rec: dict[str, Any]) -> bool:
    """Does this step_begin begin an encoder's encode (else a decode step)?"""
    return bool(rec["kind"] == ENCODE)


@dataclass(kw_only=True)
class Encode(Pass):
    """An encoder's encode (tools/mtmd: a vision or audio encoder and its projector, its graph
    computed outside ``llama_decode``) of an image's or a sound's slices: a ``Pass`` of the
    encoder's own context, ``n_tokens`` the embeddings it made."""

    media: tuple[tuple[int, int], ...] = ()  # the medium slices it encodes, (media, slice) each
    first: bool = False  # its encoder's first encode in the process
    target: tuple[int, int] | None = None  # (ctx, seq) whose prompt it serves, when said
    more: int = 0  # medium slices past those named (``media_more``)


def _pair(v: Any, name: str) -> tuple[int, int]:
    if type(v) is not list or len(v) != 2:
        raise ValueError(f"{name} is not a pair of integers")
    a, b = v
    if type(a) is not int or type(b) is not int or max(abs(a), abs(b)) >= VALUE_MAX:
        raise ValueError(f"{name} is not a pair of integers")
    return a, b


def encode_begun(rec: dict[str, Any], session_level: str) -> Encode:
    """An encode's step_begin: the medium slices it encodes (at most MAX_ENCODE_SLICES), its
    target and ``first``."""
    raw = rec.get("media", [])
    if type(raw) is not list or len(raw) > MAX_ENCODE_SLICES:
        raise ValueError(f"media is not a list of at most {MAX_ENCODE_SLICES} pairs")
    media = tuple(_pair(p, "a media slice") for p in raw)
    for m, s in media:
        uint(m)
        uint(s)
    first = rec.get("first", False)
    if type(first) is not bool:
        raise TypeError("first is not a bool")
    target = rec.get("target")
    return Encode(
        media=media,
        first=first,
        target=None if target is None else _pair(target, "target"),
        more=opt_count(rec.get("media_more")) or 0,
        **begun(rec, session_level),
    )


def decoded_medium(rec: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """A decode step's ``media``: the (media, slice) whose embeddings it decodes, or ()."""
    raw = rec.get("media")
    if raw is None:
        return ()
    m, s = _pair(raw, "media")
    return ((uint(m), uint(s)),)
