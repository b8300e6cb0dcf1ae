"""Which image or sound a prompt parted from its slot's cache at.

llama-server's ``cache`` object says, as text, where a prompt and its slot's cache diverged
(``diverged``); each token of an image or a sound is written ``[media]`` there, whatever the
medium, so that two prompts of the same text and different images read the same. The records
tell the media apart: a ``media`` record per image or sound (its id, kind, bytes and hash) and the
decode steps that carry a medium's embeddings (``step_begin.media``), at their sequence's
positions.

A slot's cache, after a request, holds the media of the cache it kept (those placed before the
tokens it reused) and those its own prompt decoded, each at its first position. The cache a
request found is the one the slot's previous request left; a slot's cache the log did not see
filled (the first request of a slot whose cache held tokens, a slot another request's task took)
is unknown. Where a prompt parted from the cache at a medium (a side's ``diverged`` text begins
with one), the media of both, in the order of their positions, are the same up to the parting
(the common prefix holds them at the same positions): the first place where they differ is each
side's medium there.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MEDIA_TEXT = "[media]"  # a medium's token, as the server writes the cache's text

# (start ns, [(sequence, its first position)], the medium whose embeddings the step decodes)
MediaStep = tuple[int, list[tuple[int, int]], int]
# a cache's media, by position: {first position: medium id}
Placed = dict[int, int]


@dataclass(frozen=True)
class Medium:
    id: int
    kind: str  # image, audio (a media record's)
    hash: str  # 16 hex digits: the hash of its pixels' or samples' bytes
    bytes: int

    @property
    def noun(self) -> str:
        return "sound" if self.kind == "audio" else self.kind

    def words(self) -> str:
        """``image 2 (hash f225cc88dbef36e1, 192,000 bytes)``."""
        return f"{self.noun} {self.id} (hash {self.hash}, {self.bytes:,} bytes)"

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "hash": self.hash, "bytes": self.bytes}


@dataclass(frozen=True)
class Parting:
    """Where a prompt parted from its slot's cache: the medium each side had there (None: text
    there, or a medium the log does not name) and the request whose prompt left the cache."""

    held: Medium | None
    prompt: Medium | None
    held_by: str | None

    def row(self) -> dict[str, Any]:
        return {
            "held": self.held.row() if self.held is not None else None,
            "prompt": self.prompt.row() if self.prompt is not None else None,
            "held_by": self.held_by,
        }

    def verdict(self) -> str:
        """What the two media are to each other, in words ("" unless both are media)."""
        if self.held is None or self.prompt is None:
            return ""
        if self.held.hash != self.prompt.hash:
            noun = self.prompt.noun if self.prompt.noun == self.held.noun else "medium"
            return f"a different {noun}"
        return f"the same {self.prompt.noun}'s bytes"


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _placed(
    rec: dict[str, Any], steps: Sequence[MediaStep], starts: Sequence[int]
) -> Placed | None:
    """The media ``rec``'s prompt decoded, at their first positions in its slot's sequence
    (None: a record without its prompt's window)."""
    t_arrive, wait, ttft = (_int(rec.get(k)) for k in ("t_arrive", "wait", "ttft"))
    if t_arrive is None or wait is None or ttft is None or ttft < wait:
        return None
    seq = _int(rec.get("slot"))
    first: dict[int, int] = {}  # medium -> its first position
    lo, hi = bisect_left(starts, t_arrive + wait), bisect_right(starts, t_arrive + ttft)
    for _, seqs, medium in steps[lo:hi]:
        for q, pos in seqs:
            if q == seq and first.get(medium, pos) >= pos:
                first[medium] = pos
    return {pos: m for m, pos in first.items()}


def _side(text: Any, media: list[tuple[int, int]], k: int) -> int | None:
    """The medium one side had where it parted: its ``k``th, when its text there is a medium's."""
    if not str(text).startswith(MEDIA_TEXT) or k >= len(media):
        return None
    return media[k][1]


def _parting(
    cache: dict[str, Any], held: Placed, prompt: Placed, known: dict[int, Medium]
) -> tuple[Medium | None, Medium | None]:
    """The media each side had where they parted (None: text there, or a medium the records do
    not name)."""
    div = cache.get("diverged")
    if not isinstance(div, dict):
        return None, None
    h, p = sorted(held.items()), sorted(prompt.items())

    def key(place: tuple[int, int]) -> tuple[int, str]:
        m = known.get(place[1])
        return place[0], m.hash if m is not None else f"id {place[1]}"

    k = 0
    while k < min(len(h), len(p)) and key(h[k]) == key(p[k]):
        k += 1
    held_id, prompt_id = _side(div.get("held"), h, k), _side(div.get("prompt"), p, k)
    return (
        known.get(held_id) if held_id is not None else None,
        known.get(prompt_id) if prompt_id is not None else None,
    )


def partings(
    requests: Iterable[dict[str, Any]], steps: Sequence[MediaStep], media: Sequence[Medium]
) -> dict[str, Parting]:
    """Each request (by id) whose prompt parted from its slot's cache at a medium that the
    records name on at least one side. ``steps``: the decode steps that carry a medium, in time
    order; ``media``: the log's media records."""
    known = {m.id: m for m in media}
    starts = [s[0] for s in steps]
    # the requests that reached a slot, in the order they began their prompts (a request's own
    # media None: it never reached its first token, and what it left is not known)
    reqs: list[tuple[int, dict[str, Any], Placed | None]] = []
    for rec in requests:
        if not isinstance(rec, dict) or _int(rec.get("slot")) is None:
            continue
        t_arrive, wait = _int(rec.get("t_arrive")), _int(rec.get("wait"))
        if t_arrive is not None and wait is not None:
            reqs.append((t_arrive + wait, rec, _placed(rec, steps, starts)))
    reqs.sort(key=lambda r: r[0])
    # slot -> the media its cache holds and the request that left it (None: not known)
    caches: dict[int, tuple[Placed, str] | None] = {}
    out: dict[str, Parting] = {}
    for _, rec, own in reqs:
        slot, rid = int(rec["slot"]), str(rec.get("id", ""))
        cache = rec["cache"] if isinstance(rec.get("cache"), dict) else {}
        # a slot first seen: empty when its cache held nothing, else filled before the log
        found = caches.get(slot, None if _int(cache.get("held")) else ({}, ""))
        caches[slot] = None
        if found is not None and own is not None:
            reused = max(_int(cache.get("reused")) or 0, 0)
            mine = {pos: m for pos, m in found[0].items() if pos < reused} | own
            held, prompt = _parting(cache, found[0], mine, known)
            if held is not None or prompt is not None:
                out[rid] = Parting(held, prompt, found[1] or None)
            caches[slot] = (mine, rid)
        for task in rec.get("tasks") or ():  # a task's slot: the log does not say what it kept
            if isinstance(task, dict) and _int(task.get("slot")) is not None:
                caches[int(task["slot"])] = None
    return out
