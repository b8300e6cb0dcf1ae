"""An image's (or a sound's) time, from the tables of ``frames_media``: its load and
preprocessing, its encodes (by op type, by part of the encoder: the input's embedding, its blocks,
its projector), the prefill of its tokens (the decode steps that carry it) and the tokens it costs.

A medium's encodes are those that name one of its slices; an encode of several media's slices
(a batch) is counted whole for each, and says so (``shared``). The first medium of an encoder is
the one its first encode in the process (``first``: the backend's threads started, a GPU's
pipelines made) encoded; ``encode_split`` gives it apart from the others.

Every figure is computed over the tables' columns, whatever the number of media; only the rows
a report shows become Python objects (``media_times``' ``limit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .frames import SessionFrames

EMBEDDING = "embedding"  # an encode's ops before its blocks (no layer)
PROJECTOR = "projector"  # its layer n_layer
_PROJECTOR_CODE = 1 << 40  # (a part's code: -1 the embedding, N block N, this the projector)


def part_name(code: int) -> str:
    if code < 0:
        return EMBEDDING
    return PROJECTOR if code == _PROJECTOR_CODE else f"block {code}"


def part_codes(f: SessionFrames) -> pd.Series:
    """Each encode op's part of its encoder as a code: -1 the input's embedding (no layer), N
    block N, ``_PROJECTOR_CODE`` the projector (layer n_layer, where the encoder's context record
    gives n_layer)."""
    ops = f.encode_ops
    n_layer = {
        int(ctx): c["model"].get("n_layer")
        for ctx, c in f.info.contexts.items()
        if c.get("role") == "encoder" and c["model"].get("n_layer") is not None
    }
    ctx = ops["step"].map(f.encodes.set_index("step")["ctx"])
    nl = ctx.map(pd.Series(n_layer, dtype="int64")).astype("Int64")
    layer = ops["layer"].astype("Int64")
    code = layer.fillna(-1).astype("int64")
    code[(layer == nl).fillna(False).to_numpy(bool)] = _PROJECTOR_CODE
    return code


def _size(kind: str, nx: int, ny: int) -> str:
    return f"{nx:,} samples" if kind == "audio" else f"{nx}x{ny}"


@dataclass
class MediumTime:
    """One medium's figures (ns; counts), as a report shows it."""

    id: int
    kind: str  # image, audio; "?" for a medium no media record describes
    size: str  # "640x488", "279,034 samples"
    tokens: int | None  # embeddings it costs the model (its record's)
    n_pos: int | None
    load_ns: int | None  # its load and preprocessing (None where the log does not say)
    preprocess_ns: int | None
    encoder: str | None  # the projector that encoded it
    encodes: int
    encode_ns: int  # its encodes, whole (until their outputs were ready)
    compute_ns: int  # of which their computes
    op_ns: int  # their timed ops
    embedding_ns: int  # of the ops: the input's embedding, the blocks, the projector
    blocks_ns: int
    projector_ns: int
    first: bool  # encoded by its encoder's first encode in the process
    shared: bool  # an encode of it also encoded another medium's slices
    embeddings: int  # the embeddings its encodes made
    prefill_steps: int  # the decode steps that carry its embeddings, their tokens and time
    prefill_tokens: int
    prefill_ns: int

    @property
    def total_ns(self) -> int:
        """Its load, preprocessing, encodes and prefill, end to end of each."""
        return (self.load_ns or 0) + (self.preprocess_ns or 0) + self.encode_ns + self.prefill_ns

    def row(self) -> dict[str, Any]:
        ms = {
            k: None if v is None else v / 1e6
            for k, v in (
                ("load_ms", self.load_ns),
                ("preprocess_ms", self.preprocess_ns),
                ("encode_ms", self.encode_ns),
                ("compute_ms", self.compute_ns),
                ("op_ms", self.op_ns),
                ("embedding_ms", self.embedding_ns),
                ("blocks_ms", self.blocks_ns),
                ("projector_ms", self.projector_ns),
                ("prefill_ms", self.prefill_ns),
                ("total_ms", self.total_ns),
            )
        }
        return {
            "media": self.id,
            "kind": self.kind,
            "size": self.size,
            "tokens": self.tokens,
            "n_pos": self.n_pos,
            "encoder": self.encoder,
            "encodes": self.encodes,
            "first": self.first,
            "shared": self.shared,
            "embeddings": self.embeddings,
            "prefill_steps": self.prefill_steps,
            "prefill_tokens": self.prefill_tokens,
            **ms,
        }


@dataclass
class MediaTimes:
    """Every medium's figures over the columns, and the rows shown."""

    n_media: int
    kinds: list[str]
    tokens: int  # the tokens of the media their records describe
    encodes: int
    first: list[MediumTime]  # each encoder's first medium
    rest_encode_ns: float | None  # the other media's encodes, per medium (None: no other)
    shared: bool
    shown: list[MediumTime]  # the firsts and the costliest others, by id


# encode-medium rows summed at a time (what a forged log's million rows cost in passing: a chunk's)
CHUNK = 1 << 16


def _per_medium(f: SessionFrames) -> PerMedium:
    """A row per medium the records name (its ``media`` record's, its encodes', its decode
    steps'), by id: its record's fields, and its encodes' and prefill's sums. The encodes'
    media are summed a chunk of rows at a time, by integer codes: no table of them joined with
    the encodes' figures."""
    em, enc = f.encode_media, f.encodes
    steps = f.steps[f.steps["media"].notna()]
    shown = ["id", "kind", "nx", "ny", "tokens", "n_pos", "load_ns", "preprocess_ns"]
    rec = f.media[shown].set_index("id")  # (one row an id: the media table's first)
    carried = steps["media"].to_numpy(np.int64)
    media, em_step = em["media"].to_numpy(np.int64), em["step"].to_numpy(np.int64)
    ids = np.union1d(rec.index.to_numpy(np.int64), carried)
    for lo in range(0, len(em), CHUNK):
        ids = np.union1d(ids, media[lo : lo + CHUNK])
    n = len(ids)
    enc_steps = enc["step"].to_numpy(np.int64)
    order = np.argsort(enc_steps, kind="stable")
    per_step = np.zeros(len(enc), np.int64)  # media each encode encoded
    for lo in range(0, len(em), CHUNK):
        at = order[np.searchsorted(enc_steps[order], em_step[lo : lo + CHUNK])]
        per_step += np.bincount(at, minlength=len(enc))
    parts = _parts_per_encode(f)
    per_encode = {
        "encode_ns": enc["dur_ns"].to_numpy(np.int64),
        "compute_ns": enc["compute_ns"].to_numpy(np.int64),
        "op_ns": enc["op_ns"].to_numpy(np.int64),
        "embeddings": enc["n_tokens"].to_numpy(np.int64),
        "encodes": np.ones(len(enc), np.int64),
        "first": enc["first"].to_numpy(np.int64),
        "shared": (per_step > 1).astype(np.int64),
        "embedding_ns": parts[:, 0],
        "blocks_ns": parts[:, 1],
        "projector_ns": parts[:, 2],
    }
    sums = {c: np.zeros(n, np.int64) for c in per_encode}
    encoder = np.full(n, None, dtype=object)
    names = enc["encoder"].astype(object).to_numpy()
    for lo in range(0, len(em), CHUNK):
        code = np.searchsorted(ids, media[lo : lo + CHUNK])
        at = order[np.searchsorted(enc_steps[order], em_step[lo : lo + CHUNK])]
        for c, values in per_encode.items():  # (a chunk's sums are exact in a double)
            w = values[at].astype(np.float64)
            sums[c] += np.bincount(code, weights=w, minlength=n).astype(np.int64)
        named, first = np.unique(code, return_index=True)
        new = encoder[named] == None  # noqa: E711 - (the first encode's name, where several)
        encoder[named[new]] = names[at[first[new]]]
    pre = np.searchsorted(ids, carried)
    sums["prefill_steps"] = np.bincount(pre, minlength=n).astype(np.int64)
    for c, col in (("prefill_tokens", "n_tokens"), ("prefill_ns", "dur_ns")):
        w = steps[col].to_numpy(np.float64)
        sums[c] = np.bincount(pre, weights=w, minlength=n).astype(np.int64)
    at = rec.index.get_indexer(ids)  # (-1: a medium no record describes)
    sums["total_ns"] = sums["encode_ns"] + sums["prefill_ns"]
    for c in ("load_ns", "preprocess_ns"):
        known = np.append(rec[c].fillna(0).to_numpy(np.int64), 0)  # (at -1: the 0 appended)
        sums["total_ns"] += known[at]
    return PerMedium(ids, sums, encoder, rec)


@dataclass
class PerMedium:
    """Every medium's sums, as columns over ``ids`` (sorted), and their records (``rec``)."""

    ids: np.ndarray
    sums: dict[str, np.ndarray]
    encoder: np.ndarray
    rec: pd.DataFrame

    def rows(self, k: np.ndarray) -> pd.DataFrame:
        """Rows ``k`` as a frame by id: their records' fields and their sums."""
        out = pd.DataFrame({c: v[k] for c, v in self.sums.items()}, index=self.ids[k])
        out["first"], out["shared"] = out["first"] > 0, out["shared"] > 0
        out["encoder"] = self.encoder[k]
        return out.join(self.rec)


def _parts_per_encode(f: SessionFrames) -> np.ndarray:
    """Per row of ``encodes``, its ops' time in the input's embedding, the blocks and the
    projector (an (n, 3) int64 block)."""
    enc, ops = f.encodes, f.encode_ops
    out = np.zeros((len(enc), 3), np.int64)
    if ops.empty:
        return out
    codes = part_codes(f).to_numpy()
    group = np.select([codes < 0, codes == _PROJECTOR_CODE], [0, 2], 1)
    steps = enc["step"].to_numpy(np.int64)
    order = np.argsort(steps, kind="stable")
    row = order[np.searchsorted(steps[order], ops["step"].to_numpy(np.int64))]
    np.add.at(out, (row, group), ops["dur_ns"].to_numpy(np.int64))
    return out


def _medium(mid: int, r: Any) -> MediumTime:
    known = not pd.isna(r.kind)
    kind = str(r.kind) if known else "?"
    opt = lambda v: None if pd.isna(v) else int(v)  # noqa: E731
    return MediumTime(
        id=int(mid),
        kind=kind,
        size=_size(kind, int(r.nx), int(r.ny)) if known else "?",
        tokens=opt(r.tokens),
        n_pos=opt(r.n_pos),
        load_ns=opt(r.load_ns),
        preprocess_ns=opt(r.preprocess_ns),
        encoder=None if pd.isna(r.encoder) else str(r.encoder),
        encodes=int(r.encodes),
        encode_ns=int(r.encode_ns),
        compute_ns=int(r.compute_ns),
        op_ns=int(r.op_ns),
        embedding_ns=int(r.embedding_ns),
        blocks_ns=int(r.blocks_ns),
        projector_ns=int(r.projector_ns),
        first=bool(r.first),
        shared=bool(r.shared),
        embeddings=int(r.embeddings),
        prefill_steps=int(r.prefill_steps),
        prefill_tokens=int(r.prefill_tokens),
        prefill_ns=int(r.prefill_ns),
    )


def media_times(f: SessionFrames, limit: int = 256) -> MediaTimes | None:
    """Every medium's figures (None for a run without images or sounds); the rows shown are each
    encoder's first medium and the costliest others, ``limit`` in all at most, by id."""
    carried = f.steps["media"].notna().any() if len(f.steps) else False
    if f.media.empty and f.encodes.empty and not carried:
        return None
    t = _per_medium(f)
    first = t.sums["first"] > 0
    rest = ~first & (t.sums["encodes"] > 0)
    others = np.flatnonzero(~first)
    costly = others[np.argsort(-t.sums["total_ns"][others], kind="stable")]
    shown = np.sort(np.concatenate([np.flatnonzero(first), costly[: max(0, limit - first.sum())]]))
    firsts, rows = t.rows(np.flatnonzero(first)), t.rows(shown)
    return MediaTimes(
        n_media=len(t.ids),
        kinds=sorted({str(k) for k in t.rec["kind"].dropna().unique()}),
        tokens=int(t.rec["tokens"].sum()),
        encodes=len(f.encodes),
        first=[_medium(i, r) for i, r in zip(firsts.index, firsts.itertuples(), strict=True)],
        rest_encode_ns=float(t.sums["encode_ns"][rest].mean()) if rest.any() else None,
        shared=bool((t.sums["shared"] > 0).any()),
        shown=[_medium(i, r) for i, r in zip(rows.index, rows.itertuples(), strict=True)],
    )


def first_media(f: SessionFrames) -> pd.DataFrame:
    """Each encoder's first medium: the one its first encode in the process named first
    (columns encoder, media)."""
    enc = f.encodes[f.encodes["first"] & f.encodes["media"].notna()]
    out = enc[["encoder", "media"]].astype({"encoder": object, "media": "int64"})
    return out.fillna({"encoder": "?"}).drop_duplicates("encoder")


def encode_split(f: SessionFrames, key: str) -> pd.DataFrame:
    """The encodes' op time by op type (``key`` "op") or by part of the encoder (``key``
    "layer": embedding, block N, projector), its first medium's encodes apart from the other
    media's: per encoder and key, first_ns (the first medium's encodes), rest_ns (the other
    media's, summed), rest_media (how many) and rest_mean_ns (per medium)."""
    ops, enc, em = f.encode_ops, f.encodes, f.encode_media
    cols = ["encoder", key, "first_ns", "rest_ns", "rest_media", "rest_mean_ns"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    names = enc["encoder"].astype(object).fillna("?")
    enc_code, encoders = pd.factorize(names)
    firsts = first_media(f).set_index("encoder")["media"]
    first_of = np.array([firsts.get(e, -1) for e in encoders], np.int64)  # -1: none
    steps = enc["step"].to_numpy(np.int64)
    order = np.argsort(steps, kind="stable")
    media, em_step = em["media"].to_numpy(np.int64), em["step"].to_numpy(np.int64)
    in_first = np.zeros(len(enc), bool)  # an encode of its encoder's first medium
    for lo in range(0, len(em), CHUNK):
        at = order[np.searchsorted(steps[order], em_step[lo : lo + CHUNK])]
        in_first[at[media[lo : lo + CHUNK] == first_of[enc_code[at]]]] = True
    ids = np.zeros(0, np.int64)
    for lo in range(0, len(em), CHUNK):
        ids = np.union1d(ids, media[lo : lo + CHUNK])
    seen = np.zeros((len(encoders), len(ids)), bool)  # the other media of each encoder
    for lo in range(0, len(em), CHUNK):
        at = order[np.searchsorted(steps[order], em_step[lo : lo + CHUNK])]
        rest = ~in_first[at]
        seen[enc_code[at][rest], np.searchsorted(ids, media[lo : lo + CHUNK][rest])] = True
    rest_media = seen.sum(axis=1)
    row = order[np.searchsorted(steps[order], ops["step"].to_numpy(np.int64))]
    what = ops["label"].astype(str) if key == "op" else part_codes(f)
    df = pd.DataFrame(
        {
            "encoder": enc_code[row],
            key: what.to_numpy(),
            "first": in_first[row],
            "dur_ns": ops["dur_ns"].to_numpy(),
        }
    )
    sums = df.groupby(["encoder", key, "first"])["dur_ns"].sum().unstack(fill_value=0)
    sums = sums.reindex(columns=[True, False], fill_value=0)
    out = pd.DataFrame(
        {"first_ns": sums[True].astype("int64"), "rest_ns": sums[False].astype("int64")}
    ).reset_index()
    out["rest_media"] = [
        int(rest_media[e]) if rest_media is not None else 0 for e in out["encoder"]
    ]
    out["rest_mean_ns"] = [
        r / n if n else None for r, n in zip(out["rest_ns"], out["rest_media"], strict=True)
    ]
    if key == "layer":
        out = out.sort_values(["encoder", key])
        out[key] = [part_name(int(c)) for c in out[key]]
    else:
        out = out.sort_values(["encoder", "rest_ns", "first_ns"], ascending=[True, False, False])
    out["encoder"] = [str(encoders[e]) for e in out["encoder"]]
    return out[cols].reset_index(drop=True)
