"""A request's images and sounds: the encodes that served its prompt, beside the prefill of
their tokens and of its text, as causes of its first token's time.

A request's encodes are those whose ``request`` is its id, or, where an encode names none, whose
``target`` sequence is its slot's (sequence 0 without a slot) and which began while its prompt
was processed (from ``t_arrive + wait`` to its first token, ``t_arrive + ttft``). Its prompt
steps are its slot's steps that began then: those that carry a medium's embeddings are its media
prefill, the others its text prefill (a step's whole time, a batch shared with other slots
included). Nothing here is estimated: each part is the sum of the records' own times.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# (start ns, duration ns, [(sequence, its tokens)], the medium it carries or None)
PromptRow = tuple[int, int, list[tuple[int, int]], int | None]
# (start ns, duration ns, its request or None, its target sequence or None, its media, first)
EncodeRow = tuple[int, int, str | None, int | None, tuple[int, ...], bool]


@dataclass
class RequestMedia:
    prompt_ns: int  # from its slot's start to its first token (the story's prompt)
    encodes: int
    encode_ns: int
    first: bool  # one of them was its encoder's first encode in the process
    first_ns: int  # that one's time
    media: list[int]  # the media they encoded
    media_steps: int
    media_prefill_ns: int
    text_steps: int
    text_prefill_ns: int
    noun: str = "medium"  # what its media are: image, sound (medium: mixed, or not said)

    def row(self) -> dict[str, Any]:
        return {
            "media": self.media,
            "encodes": self.encodes,
            "encode_ms": self.encode_ns / 1e6,
            "first_encode": self.first,
            "media_prefill_ms": self.media_prefill_ns / 1e6,
            "text_prefill_ms": self.text_prefill_ns / 1e6,
        }

    def cause(self, rid: str) -> str:
        """Its first token's time in words, the largest part first: "first token of task-3
        after a prompt of 912.4 ms: encode of its image 2: 611.0 ms; prefill of its text: ..."."""
        steps = lambda n: f"{n} step{'s' * (n != 1)}"  # noqa: E731
        first = f" (the encoder's first in the process: {self._ms(self.first_ns)})"
        adjunct = "media" if self.noun == "medium" else self.noun
        parts = [
            (self.encode_ns, f"encode of its {self._ids()}: {self._ms(self.encode_ns)}"
             + (first if self.first else "")),
            (self.media_prefill_ns, f"prefill of the {adjunct} tokens: "
             f"{self._ms(self.media_prefill_ns)} in {steps(self.media_steps)}"),
            (self.text_prefill_ns, f"prefill of its text: {self._ms(self.text_prefill_ns)} in "
             f"{steps(self.text_steps)}"),
        ]  # fmt: skip
        parts.sort(key=lambda p: -p[0])
        head = f"first token of {rid} after a prompt of {self._ms(self.prompt_ns)}"
        return f"{head}: " + "; ".join(text for _, text in parts)

    def _noun(self, n: int) -> str:
        if n == 1:
            return self.noun
        return "media" if self.noun == "medium" else f"{self.noun}s"

    def _ids(self) -> str:
        return f"{self._noun(len(self.media))} {', '.join(str(m) for m in self.media)}".rstrip()

    @staticmethod
    def _ms(ns: int) -> str:
        return f"{ns / 1e6:,.1f} ms"


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def request_media(
    requests: Sequence[dict[str, Any]],
    rows: Sequence[PromptRow],
    encodes: Sequence[EncodeRow],
    nouns: dict[int, str] | None = None,
) -> dict[str, RequestMedia]:
    """Each request with an encode, by id. ``rows``: the decode steps in time order; ``encodes``:
    the encodes in time order; ``nouns``: each medium's kind in words (image, sound). Each
    request's steps and encodes are found by bisection, so that requests cost what their own
    steps do."""
    starts = [r[0] for r in rows]
    enc_starts = [e[0] for e in encodes]
    out: dict[str, RequestMedia] = {}
    for rec in requests:
        t_arrive, wait, ttft = (_int(rec.get(k)) for k in ("t_arrive", "wait", "ttft"))
        if t_arrive is None or wait is None or ttft is None or ttft < wait:
            continue
        rid = str(rec.get("id", ""))
        slot = _int(rec.get("slot"))
        seq = slot if slot is not None else 0
        t0, t1 = t_arrive + wait, t_arrive + ttft
        mine = [
            e
            for e in encodes[bisect_left(enc_starts, t0) : bisect_right(enc_starts, t1)]
            if e[2] == rid or (e[2] is None and e[3] == seq)
        ]
        if not mine:
            continue
        media, text = [0, 0], [0, 0]
        for _, dur, seqs, medium in rows[bisect_left(starts, t0) : bisect_right(starts, t1)]:
            if any(q == seq for q, _ in seqs):
                part = media if medium is not None else text
                part[0] += 1
                part[1] += dur
        firsts = [e for e in mine if e[5]]
        ids = sorted({m for e in mine for m in e[4]})
        kinds = {(nouns or {}).get(m, "medium") for m in ids}
        out[rid] = RequestMedia(
            prompt_ns=t1 - t0,
            encodes=len(mine),
            encode_ns=sum(e[1] for e in mine),
            first=bool(firsts),
            first_ns=sum(e[1] for e in firsts),
            media=ids,
            media_steps=media[0],
            media_prefill_ns=media[1],
            text_steps=text[0],
            text_prefill_ns=text[1],
            noun=kinds.pop() if len(kinds) == 1 else "medium",
        )
    return out
