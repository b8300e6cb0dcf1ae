"""Decode steps: ``Step``, and what step_begin, step_end and topk records say of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .media import Encode
from .passes import Pass


@dataclass(kw_only=True)
class Step(Pass):
    """A ``Pass`` of ``llama_decode`` (or, kind "encode", an encoder's: its graph outside it)."""

    kind: str  # "prompt", "gen", or "encode" (an encoder's: its graph outside llama_decode)
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    seqs: list[tuple[int, int, int, int]] = field(default_factory=list)  # seq, n_tokens, pos0, pos1
    topk: list[dict[str, Any]] = field(default_factory=list)
    # images and sounds: an encode's medium slices, (media, slice) each; a decode step's medium
    # whose embeddings it decodes (one pair); () for the rest
    media: tuple[tuple[int, int], ...] = ()
    encode: Encode | None = None  # an encode's target and ``first`` (kind "encode")


def step_kind(rec: dict[str, Any]) -> str:
    """A step_begin's kind: ``gen``, ``encode``, or ``prompt`` (any other)."""
    kind = rec["kind"]
    return kind if kind in ("gen", "encode") else "prompt"


def step_seqs(rec: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """step_begin.seqs: [seq, n_tokens, first pos, last pos] per sequence (well-formed rows)."""
    out = []
    for row in rec.get("seqs") or []:
        if isinstance(row, list) and len(row) == 4:
            out.append((int(row[0]), int(row[1]), int(row[2]), int(row[3])))
    return out


def topk_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A topk record's well-formed rows."""
    return [
        r
        for r in rec["rows"]
        if isinstance(r, dict)
        and isinstance(r.get("ids"), list)
        and isinstance(r.get("logits"), list)
        and r["ids"]
        and r["logits"]
    ]
