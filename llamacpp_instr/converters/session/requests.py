"""Which decode steps served which request when requests share batches, and each one's share.

llama-server decodes the tokens of several slots in one batch: a step's ``seqs`` says how many of
its tokens each sequence had, and a llama-server ``request`` record names its ``slot``, which is the
sequence id of its tokens. A request's steps are the steps whose batch holds its sequence while it
held the slot: from ``t_arrive + wait`` (the slot started its prompt) to ``t_arrive + wait + model``
(the slot let it go; ``t_arrive + dur``, the end of the response, in logs without ``model``). A
slot serves one request at a time, so these windows never overlap for one sequence. A step's time
is shared out by tokens: a request with 3 of a batch's 4 tokens gets 3/4 of that step's
``llama_decode`` time, so the shares of all requests add up to at most the steps' time, never
more. The trace layout feeds ``SeqSteps`` as it reads; the summary's sections
(``reports.request_share``) read it from the frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestShare:
    id: str
    slot: int
    steps: int  # steps whose batch carried its tokens
    shared_steps: int  # of those, the steps that also carried other sequences' tokens
    tokens: int  # its tokens decoded in them
    steps_ns: int  # the whole llama_decode time of those steps
    share_ns: int  # its share of that time, by tokens

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "slot": self.slot,
            "steps": self.steps,
            "shared_steps": self.shared_steps,
            "tokens": self.tokens,
            "steps_ms": self.steps_ns / 1e6,
            "share_ms": self.share_ns / 1e6,
        }


class SeqSteps:
    """The steps each sequence had tokens in, in time order, as a log is read: a request's record
    comes after its steps, so they are kept until it does (the trace layout feeds this as it goes,
    the summary from the frames)."""

    def __init__(self) -> None:
        # seq -> [(t_start, dur, its tokens, the batch's tokens, sequences in the batch)]
        self.by_seq: dict[int, list[tuple[int, int, int, int, int]]] = {}

    def add(self, start: int, dur: int, n_tokens: int, seqs: Sequence[tuple[int, ...]]) -> None:
        """A step: its ``seqs`` rows begin with (sequence, its tokens)."""
        rows = seqs or [(0, n_tokens)]  # a step without seqs holds sequence 0 only
        for q, n, *_ in rows:
            self.by_seq.setdefault(int(q), []).append((start, dur, int(n), n_tokens, len(rows)))

    def share(self, rec: dict[str, Any]) -> RequestShare | None:
        """The share of a request record with a ``slot``; its steps are then forgotten (the next
        request of that slot starts after it ended)."""
        try:
            slot = int(rec["slot"])
            t0, t1 = slot_window(rec)
        except (KeyError, TypeError, ValueError):
            return None
        steps = self.by_seq.get(slot, [])
        mine = [x for x in steps if t0 <= x[0] <= t1]
        self.by_seq[slot] = [x for x in steps if x[0] > t1]
        return RequestShare(
            id=str(rec.get("id", "")),
            slot=slot,
            steps=len(mine),
            shared_steps=sum(1 for x in mine if x[4] > 1),
            tokens=sum(x[2] for x in mine),
            steps_ns=sum(x[1] for x in mine),
            share_ns=int(sum(x[1] * x[2] / max(x[3], 1) for x in mine)),
        )


def slot_window(rec: dict[str, Any]) -> tuple[int, int]:
    """When a request held its slot: from ``t_arrive + wait`` to ``+ model`` (the slot let it go),
    or to ``t_arrive + dur`` when the record has no ``model``."""
    t0 = int(rec["t_arrive"]) + int(rec.get("wait") or 0)
    model = rec.get("model")
    t1 = t0 + int(model) if model is not None else int(rec["t_arrive"]) + int(rec.get("dur") or 0)
    return t0, t1


def task_windows(rec: dict[str, Any]) -> list[tuple[int, int, int]]:
    """``(slot, t0, t1)`` of each of a llama-server request's tasks after its first (its
    ``tasks``: its other prompts, and the further completions of ``n_cmpl``) that held a slot,
    as ``slot_window`` gives its first task's."""
    out = []
    for k in rec.get("tasks") or ():
        if k.get("slot") is None or k.get("wait") is None:
            continue
        t0 = int(rec["t_arrive"]) + int(k["wait"])
        model = k.get("model")
        t1 = (
            t0 + int(model)
            if model is not None
            else int(rec["t_arrive"]) + int(rec.get("dur") or 0)
        )
        out.append((int(k["slot"]), t0, t1))
    return out


def all_tokens(rec: dict[str, Any]) -> tuple[int, int]:
    """A request's prompt and generated tokens decoded, over all its tasks (its first's at the
    record's top level, the others' in its ``tasks``)."""
    tasks = rec.get("tasks") or ()
    prompt = int(rec.get("prompt_tokens") or 0) + sum(
        int(k.get("prompt_tokens") or 0) for k in tasks
    )
    gen = int(rec.get("gen_tokens") or 0) + sum(int(k.get("gen_tokens") or 0) for k in tasks)
    return prompt, gen
