"""Decode steps: ``Step``, and what step_begin and topk records say of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .media import decoded_medium
from .passes import Pass, begun


@dataclass(kw_only=True)
class Step(Pass):
    """A ``Pass`` of ``llama_decode``: a batch of tokens decoded (an encoder's encode is no
    ``Step``: ``media.Encode``)."""

    kind: str  # "prompt" or "gen"
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    seqs: list[tuple[int, int, int, int]] = field(default_factory=list)  # seq, n_tokens, pos0, pos1
    topk: list[dict[str, Any]] = field(default_factory=list)
    # an image's or a sound's: the (media, slice) whose embeddings it decodes (one pair), or ()
    media: tuple[tuple[int, int], ...] = ()


def step_begun(rec: dict[str, Any], session_level: str) -> Step:
    """A decode step's step_begin: its kind (``gen``, else ``prompt``), tokens and sequences."""
    media = decoded_medium(rec)
    return Step(
        **begun(rec, session_level),
        kind="gen" if rec["kind"] == "gen" else "prompt",
        tokens=[int(t) for t in rec.get("tokens", [])],
        pieces=[str(x) for x in rec.get("pieces", [])],
        seqs=step_seqs(rec),
        media=media,
    )


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
