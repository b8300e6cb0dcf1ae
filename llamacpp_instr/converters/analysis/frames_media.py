"""Images and sounds as tables (``load_session(...).media``, ``.encodes``, ``.encode_layers``,
``.encode_ops``, and the steps' ``media`` and ``media_slice``).

An encoder (tools/mtmd: a vision or audio encoder and its projector) computes its graph outside
``llama_decode``: its encodes are passes of its own context (``Encode``, the fold's ``EncodeDone``;
no ``Step``), in tables of their own: the ``steps``, ``layers`` and ``ops`` tables hold the
language model's decode steps only, so that no prompt or generation figure counts an encode.

* ``media`` — one row per medium (the first ``media`` record of each id): id, kind (image,
  audio), nx, ny (pixels; a sound's samples and 1), frames, bytes, hash, slices (the encoder
  inputs it became), tokens and n_pos (the embeddings it costs the model, the positions they
  take), t_load, load_ns (its decoding from its file), t_preprocess, preprocess_ns (its resizing,
  slicing, mel spectrogram and tokenizing; null where the log does not say), ts.
* ``encodes`` — one row per encode: step, ctx (the encoder's), encoder (its projector type),
  t_start, dur_ns (the whole encode: its graph's build, the compute, the copy of the embeddings
  out), compute_ns (its computes), op_ns (its timed ops), n_tokens (the embeddings it made),
  media and slice (its first medium slice; each one in ``encode_media``), n_slices (the slices it
  encoded, those past the 64 a record names included), first (its encoder's first encode in the process: the backend's threads
  started, a GPU's pipelines made), target_ctx, target_seq (whose prompt it served, where said),
  request, level, status, ended.
* ``encode_media`` — one row per medium an encode encoded: step, media, slices (how many of its
  slices the encode's record names).
* ``encode_layers``, ``encode_ops`` — the encodes' layer spans and timed ops, with the columns
  of ``layers`` and ``ops``: the encoder's blocks are layers 0 to n_layer - 1, its projector
  layer n_layer, the input's embedding no layer (null).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.media import KINDS, Encode
from ..reading.decode.sessions import SessionInfo
from .table_columns import Table, string_categories

MEDIA_COLS = (
    "id kind nx ny frames bytes hash slices tokens n_pos t_load load_ns t_preprocess "
    "preprocess_ns ts"
).split()
ENCODE_COLS = (
    "step ctx encoder t_start dur_ns compute_ns op_ns n_tokens media slice n_slices first "
    "target_ctx target_seq request level status ended"
).split()


def media_frame(info: SessionInfo) -> pd.DataFrame:
    """The ``media`` table: the first record of each id, in log order (from the columns the
    session keeps: no Python object per medium)."""
    t = info.media
    ids = t.column("id")
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(
        ids
    ):  # (every id once, as the writer writes them: the columns as they are)
        col = {f: t.column(f) for f in t.FIELDS}
    else:
        keep = np.sort(first)
        col = {f: t.column(f)[keep] for f in t.FIELDS}
    data: dict[str, Any] = {c: col[c] for c in MEDIA_COLS if c in col and c not in ("kind", "hash")}
    for c, when in (("load_ns", "t_load"), ("preprocess_ns", "t_preprocess")):
        missing = col[when] < 0
        data[when] = pd.arrays.IntegerArray(np.where(missing, 0, col[when]), missing)
        data[c] = pd.arrays.IntegerArray(col[c].copy(), missing.copy())
    kinds = np.array([*KINDS, "other"], dtype=object)
    codes = col["kind"]
    seen = list(dict.fromkeys(codes.tolist()))  # categories in order of first appearance
    lut = np.zeros(len(kinds), np.int8)
    lut[seen] = np.arange(len(seen))
    data["kind"] = pd.Categorical.from_codes(lut[codes], categories=list(kinds[seen]))
    hashes = [(h & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big").hex() for h in col["hash"].tolist()]
    data["hash"] = pd.Categorical(hashes, categories=list(dict.fromkeys(hashes)))
    df = pd.DataFrame({c: data[c] for c in MEDIA_COLS}, copy=False)
    for c in ("kind", "hash"):
        df[c] = string_categories(df[c])
    return df


class EncodeRows:
    """The ``encodes`` table as its steps come."""

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.t = Table(
            "step ctx t_start dur_ns compute_ns op_ns n_tokens media slice n_slices first "
            "target_ctx target_seq status ended",
            cats="encoder request level",
            nullable="media slice target_ctx status",
        )
        # per medium an encode encoded: its step, the medium, how many of its slices
        self.em_step, self.em_media, self.em_slices = array("q"), array("q"), array("i")

    def add(self, s: Encode, dur_ns: int, op_ns: int) -> None:
        """An encode, ``dur_ns`` until its outputs were ready."""
        first = s.media[0] if s.media else (None, None)
        target = s.target
        arch = self.info.contexts.get(s.ctx, {}).get("model", {}).get("architecture")
        self.t.add(
            step=s.index, ctx=s.ctx, encoder=arch, t_start=s.start, dur_ns=dur_ns,
            compute_ns=sum(c.dur for c in s.computes), op_ns=op_ns, n_tokens=s.n_tokens,
            media=first[0], slice=first[1], n_slices=len(s.media) + s.more, first=int(s.first),
            target_ctx=target[0] if target else None,
            target_seq=target[1] if target else None,
            request=s.request, level=s.level or self.info.level, status=s.status,
            ended=int(s.ended),
        )  # fmt: skip
        slices: dict[int, int] = {}
        for m, _ in s.media:
            slices[m] = slices.get(m, 0) + 1
        for m, n in slices.items():
            self.em_step.append(s.index)
            self.em_media.append(m)
            self.em_slices.append(n)

    def frame(self) -> pd.DataFrame:
        df = self.t.frame(ENCODE_COLS)
        # a target's sequence may be -1 (none in particular): null only where there is no target
        df["target_seq"] = df["target_seq"].astype("Int64").where(df["target_ctx"].notna())
        df["first"] = df["first"].astype(bool)
        df["ended"] = df["ended"].astype(bool)
        for c in ("encoder", "request", "level"):
            df[c] = string_categories(df[c])
        return df

    def media_frame(self) -> pd.DataFrame:
        """The ``encode_media`` table: its columns the arrays themselves (no copy)."""
        cols: list[tuple[str, array[int], Any]] = [
            ("step", self.em_step, np.int64),
            ("media", self.em_media, np.int64),
            ("slices", self.em_slices, np.int32),
        ]
        data = {c: np.frombuffer(a, t) if len(a) else np.zeros(0, t) for c, a, t in cols}
        return pd.DataFrame(data, copy=False)
