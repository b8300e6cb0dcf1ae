"""Which decode steps served which request when requests share batches, and each one's share.

llama-server decodes the tokens of several slots in one batch: a step's ``seqs`` says how many of
its tokens each sequence had, and a llama-server ``request`` record names its ``slot``, which is the
sequence id of its tokens. A request's steps are the steps whose batch holds its sequence while it
held the slot: from ``t_arrive + wait`` (the slot started its prompt) to ``t_arrive + dur`` (the
final response). A slot serves one request at a time, so these windows never overlap for one
sequence. A step's time is shared out by tokens: a request with 3 of a batch's 4 tokens gets 3/4
of that step's ``llama_decode`` time, so the shares of all requests add up to at most the steps'
time, never more.

Also the ``part`` records (llama-bench's tests): each part's steps, tokens and time, with the op
type that took most of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .report import Column, Section, Table

if TYPE_CHECKING:  # the trace layout imports this module: no pandas on its path
    from .frames import SessionFrames


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

    def add(
        self, start: int, dur: int, n_tokens: int, seqs: list[tuple[int, int, int, int]]
    ) -> None:
        rows = seqs or [(0, n_tokens, 0, 0)]  # a step without seqs holds sequence 0 only
        for q, n, _, _ in rows:
            self.by_seq.setdefault(int(q), []).append((start, dur, int(n), n_tokens, len(rows)))

    def share(self, rec: dict[str, Any]) -> RequestShare | None:
        """The share of a request record with a ``slot``; its steps are then forgotten (the next
        request of that slot starts after it ended)."""
        try:
            slot = int(rec["slot"])
            t0 = int(rec["t_arrive"]) + int(rec.get("wait") or 0)
            t1 = int(rec["t_arrive"]) + int(rec.get("dur") or 0)
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


def request_shares(f: SessionFrames) -> list[RequestShare]:
    """Each request with a ``slot`` (llama-server's), in the order their records were written."""
    reqs = [r for r in f.info.requests if r.get("slot") is not None]
    if not reqs:
        return []
    seqs: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    if f.seqs is not None and not f.seqs.empty:
        cols = f.seqs[["ctx", "step", "seq", "n_tokens", "pos0", "pos1"]].astype("int64")
        for ctx, step, q, n, p0, p1 in cols.itertuples(False):
            seqs.setdefault((int(ctx), int(step)), []).append((int(q), int(n), int(p0), int(p1)))
    index = SeqSteps()
    cols = f.steps[["ctx", "step", "t_start", "dur_ns", "n_tokens"]].sort_values("t_start")
    for ctx, step, start, dur, n in cols.itertuples(False):
        index.add(int(start), int(dur), int(n), seqs.get((int(ctx), int(step)), []))
    out = []
    for r in sorted(reqs, key=lambda r: int(r.get("t_arrive", 0)) + int(r.get("dur") or 0)):
        sh = index.share(r)
        if sh is not None:
            out.append(sh)
    return out


def part_rows(f: SessionFrames) -> list[dict[str, Any]]:
    """Each ``part`` (a llama-bench test): its steps (those tagged with its label), tokens, time in
    llama_decode, tokens/s, and the op type that took most of its op time (when ops were timed)."""
    parts = getattr(f.info, "parts", [])
    out = []
    for p in parts:
        label = str(p.get("label", ""))
        steps = f.steps[f.steps["request"].astype(object) == label]
        dur = int(steps["dur_ns"].sum())
        tokens = int(steps["n_tokens"].sum())
        top_op, top_share = "", 0.0
        if not f.ops.empty and len(steps):
            ops = f.ops[f.ops["step"].isin(steps["step"])]
            if len(ops):
                by = ops.groupby(ops["op"].astype(str), observed=True)["dur_ns"].sum()
                top_op = str(by.idxmax())
                top_share = float(by.max() / by.sum()) if by.sum() else 0.0
        out.append(
            {
                "label": label,
                "steps": len(steps),
                "tokens": tokens,
                "dur_ms": int(p.get("dur", 0)) / 1e6,
                "decode_ms": dur / 1e6,
                "tokens_per_s": tokens / (dur / 1e9) if dur else 0.0,
                "top_op": top_op,
                "top_op_share": top_share,
            }
        )
    return out


def share_section(shares: list[RequestShare]) -> Section:
    return Section(
        "Requests in shared batches",
        text="llama-server decodes several requests' tokens in one batch: each request's share "
        "of a step's time is its tokens' share of the batch.",
        tables=[
            Table(
                "request_share",
                "Each request's steps and its share of their time",
                [
                    Column("id", "request"),
                    Column("slot", "slot", "int"),
                    Column("steps", "steps", "int"),
                    Column("shared_steps", "shared with others", "int"),
                    Column("tokens", "its tokens", "int"),
                    Column("steps_ms", "steps' time (ms)", "f2"),
                    Column("share_ms", "its share (ms)", "f2"),
                ],
                [s.row() for s in shares],
            )
        ],
    )


def parts_section(rows: list[dict[str, Any]]) -> Section:
    return Section(
        "Parts",
        text="Labelled parts of the run (llama-bench: one per test, warm-up and repetitions "
        "included).",
        tables=[
            Table(
                "parts",
                "Each part's steps and time",
                [
                    Column("label", "part"),
                    Column("steps", "steps", "int"),
                    Column("tokens", "tokens", "int"),
                    Column("dur_ms", "part (ms)", "f2"),
                    Column("decode_ms", "in llama_decode (ms)", "f2"),
                    Column("tokens_per_s", "tokens/s", "f1"),
                    Column("top_op", "top op type"),
                    Column("top_op_share", "its share of op time", "pct"),
                ],
                rows,
            )
        ],
    )
