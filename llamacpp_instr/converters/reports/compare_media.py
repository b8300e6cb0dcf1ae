"""``instr compare`` of two runs with images or sounds: their encoders side by side.

Each run's encodes (``frames.encodes``, ``encode_ops``): its encoders, media and the tokens each
medium costs, the time an encode and a medium take, and per op type and per part of the encoder
(the input's embedding, its blocks, its projector) the time per encode. An encoder's first encode
in the process starts its backend's threads (a GPU's pipelines): the per-encode times are the
other encodes' where a run has any, the first's alone where it has no other, and the tables say
which.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis.frames import SessionFrames
from ..analysis.media_time import EMBEDDING, PROJECTOR, part_codes, part_name
from .report import Column, Section, Table


def _pool(f: SessionFrames) -> tuple[pd.DataFrame, str]:
    """The encodes the per-encode times are of, and which they are."""
    enc = f.encodes
    rest = enc[~enc["first"]]
    if len(rest):
        return rest, "the encodes after the first"
    return enc, "the first encode (no other)"


def encoders(f: SessionFrames) -> dict[str, Any] | None:
    """One run's encoders in figures (None without an encode)."""
    enc = f.encodes
    if enc.empty:
        return None
    pool, which = _pool(f)
    first = enc[enc["first"]]
    media = f.media
    names = sorted({str(x) for x in enc["encoder"].dropna()}) or ["?"]
    kinds = sorted({str(k) for k in media["kind"]}) if len(media) else []
    return {
        "encoders": names,
        "kinds": kinds,
        "media": int(len(media)),
        "sizes": sorted(
            {
                f"{r.nx} samples" if r.kind == "audio" else f"{r.nx}x{r.ny}"
                for r in media.itertuples()
            }
        ),
        "tokens_per_medium": float(media["tokens"].mean()) if len(media) else None,
        "encodes": int(len(enc)),
        "embeddings_per_encode": float(enc["n_tokens"].mean()),
        "encode_ms_per_medium": float(enc["dur_ns"].sum()) / max(1, len(media)) / 1e6,
        "first_encode_ms": float(first["dur_ns"].sum()) / 1e6 if len(first) else None,
        "encode_ms": float(pool["dur_ns"].mean()) / 1e6,
        "of": which,
        "per_op": _per_encode(f, pool, "op"),
        "per_layer": _per_encode(f, pool, "layer"),
    }


def _per_encode(f: SessionFrames, pool: pd.DataFrame, key: str) -> dict[str, float]:
    """Each op type's (or part's) time per encode of ``pool``, ms."""
    ops = f.encode_ops
    if ops.empty or pool.empty:
        return {}
    what = ops["label"].astype(str) if key == "op" else part_codes(f)
    mine = ops["step"].isin(pool["step"]).to_numpy()
    sums = ops["dur_ns"][mine].groupby(what[mine].to_numpy()).sum()
    name = str if key == "op" else lambda c: part_name(int(c))
    return {name(k): float(v) / len(pool) / 1e6 for k, v in sums.items()}


def _ratio(a: Any, b: Any) -> float | None:
    return b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None


def compare_encoders(a: SessionFrames, b: SessionFrames) -> dict[str, Any] | None:
    """Both runs' encoders side by side (None when neither encoded anything)."""
    ea, eb = encoders(a), encoders(b)
    if ea is None and eb is None:
        return None
    empty: dict[str, Any] = {"per_op": {}, "per_layer": {}}
    xa, xb = ea or empty, eb or empty
    rows = []
    for key, name in (
        ("media", "media"),
        ("tokens_per_medium", "tokens per medium"),
        ("encodes", "encodes"),
        ("embeddings_per_encode", "embeddings per encode"),
        ("encode_ms_per_medium", "encode per medium (ms)"),
        ("first_encode_ms", "the encoder's first encode (ms)"),
        ("encode_ms", "an encode (ms)"),
    ):
        va, vb = xa.get(key), xb.get(key)
        rows.append({"what": name, "a": va, "b": vb, "ratio": _ratio(va, vb)})
    per: dict[str, list[dict[str, Any]]] = {}
    for key in ("op", "layer"):
        pa, pb = xa[f"per_{key}"], xb[f"per_{key}"]
        names = list(dict.fromkeys([*pa, *pb]))
        if key == "layer":
            names.sort(key=_part_order)
        else:
            names.sort(key=lambda n: -(pa.get(n, 0.0) + pb.get(n, 0.0)))
        per[key] = [
            {key: n, "a_ms": pa.get(n), "b_ms": pb.get(n), "ratio": _ratio(pa.get(n), pb.get(n))}
            for n in names
        ]
    return {
        "a": {k: v for k, v in xa.items() if not k.startswith("per_")} if ea else None,
        "b": {k: v for k, v in xb.items() if not k.startswith("per_")} if eb else None,
        "rows": rows,
        "per_op": per["op"],
        "per_layer": per["layer"],
    }


def _part_order(part: str) -> float:
    if part == EMBEDDING:
        return -1
    if part == PROJECTOR:
        return float("inf")
    return float(part.split()[1]) if part.startswith("block ") else float("inf")


def differences(c: dict[str, Any]) -> list[str]:
    """How the runs' encoders and media differ, one phrase each."""
    a, b = c.get("a") or {}, c.get("b") or {}
    out = []
    for key, name in (("encoders", "encoder"), ("kinds", "media kinds"), ("sizes", "media sizes")):
        va, vb = ", ".join(a.get(key, [])) or "none", ", ".join(b.get(key, [])) or "none"
        if va != vb:
            out.append(f"{name}: A {va}, B {vb}")
    return out


def section(c: dict[str, Any]) -> Section:
    a, b = c.get("a") or {}, c.get("b") or {}
    cols = [Column("a", "A", "f2"), Column("b", "B", "f2"), Column("ratio", "B/A", "ratio")]
    ms = [Column("a_ms", "A (ms/encode)", "f3"), Column("b_ms", "B (ms/encode)", "f3")]
    ms.append(Column("ratio", "B/A", "ratio"))
    which = f"A: {a.get('of', 'no encode')}; B: {b.get('of', 'no encode')}"
    return Section(
        "Encoders",
        text=(
            f"A's encoders: {', '.join(a.get('encoders', [])) or 'none'}; B's: "
            f"{', '.join(b.get('encoders', [])) or 'none'}. Time per encode, of {which} (an "
            "encoder's first encode starts its backend's threads, a GPU's pipelines)."
        ),
        tables=[
            Table("encoders", "The encoders", [Column("what", "what"), *cols], c["rows"]),
            Table(
                "encode_per_op",
                "An encode's time per op type",
                [Column("op", "op type"), *ms],
                c["per_op"],
                top=12,
            ),
            Table(
                "encode_per_layer",
                "An encode's time per part of the encoder",
                [Column("layer", "part"), *ms],
                c["per_layer"],
                whole=True,
            ),
        ],
    )
