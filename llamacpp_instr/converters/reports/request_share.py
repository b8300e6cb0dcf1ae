"""The summary's sections on requests and parts: each request's share of the steps that served
it when requests share batches (the shares themselves: ``session.requests``), and the ``part``
records (llama-bench's tests): each part's steps, tokens and time, with the op type that took
most of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..session.request_causes import StepRow
from ..session.requests import RequestShare, SeqSteps, slot_window
from .report import Column, Section, Table

if TYPE_CHECKING:  # pandas loads with the frames, not with this module
    from ..analysis.frames import SessionFrames


def step_rows(f: SessionFrames, role: str = "target") -> list[StepRow]:
    """The session's steps in time order: (start, duration, the batch's tokens, [(sequence, its
    tokens)]); a step without ``seqs`` holds sequence 0 only. A speculating session's are its
    target's (``role="draft"``: its draft's): a draft's steps carry a request's sequence too, but
    decode none of its tokens."""
    return [row for row, _ in indexed_step_rows(f, role)]


def indexed_step_rows(f: SessionFrames, role: str = "target") -> list[tuple[StepRow, int]]:
    """``step_rows``, each with its step's index."""
    seqs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    if f.seqs is not None and not f.seqs.empty:
        cols = f.seqs[["ctx", "step", "seq", "n_tokens"]].astype("int64")
        for ctx, step, q, n in cols.itertuples(False):
            seqs.setdefault((int(ctx), int(step)), []).append((int(q), int(n)))
    steps = f.steps
    if "role" in steps and steps["role"].notna().any():
        keep = steps["role"].astype(object) == role
        steps = steps[keep.to_numpy() | (steps["role"].isna().to_numpy() & (role == "target"))]
    elif role != "target":
        return []
    cols = steps[["ctx", "step", "t_start", "dur_ns", "n_tokens"]].sort_values("t_start")
    return [
        (
            (int(start), int(dur), int(n), seqs.get((int(ctx), int(step))) or [(0, int(n))]),
            int(step),
        )
        for ctx, step, start, dur, n in cols.itertuples(False)
    ]


def request_shares(f: SessionFrames, rows: list[StepRow] | None = None) -> list[RequestShare]:
    """Each request with a ``slot`` (llama-server's), in the order their records were written;
    ``rows``: ``step_rows(f)``, when the caller has them already."""
    reqs = [r for r in f.info.requests if r.get("slot") is not None]
    if not reqs:
        return []
    index = SeqSteps()
    for start, dur, n, seqs in step_rows(f) if rows is None else rows:
        index.add(start, dur, n, seqs)
    out = []

    def end(r: dict[str, Any]) -> int:
        try:
            return slot_window(r)[1]
        except (KeyError, TypeError, ValueError):
            return 0

    for r in sorted(reqs, key=end):
        sh = index.share(r)
        if sh is not None:
            out.append(sh)
    return out


def part_rows(f: SessionFrames) -> list[dict[str, Any]]:
    """Each ``part`` (a llama-bench test): its steps (those tagged with its label), tokens, time in
    llama_decode, tokens/s, and the op type that took most of its op time (when ops were timed).
    The steps and ops are grouped by label once, whatever the number of parts."""
    parts = getattr(f.info, "parts", [])
    if not parts:
        return []
    labels = {str(p.get("label", "")) for p in parts}
    steps = f.steps[f.steps["request"].astype(object).isin(labels)]
    label_of = steps["request"].astype(object)
    per = steps.groupby(label_of)[["dur_ns", "n_tokens"]].agg(["sum", "count"])
    top: dict[str, tuple[str, float]] = {}
    if not f.ops.empty and len(steps):
        step_label = dict(zip(steps["step"].tolist(), label_of.tolist(), strict=True))
        ops = f.ops[f.ops["step"].isin(step_label)]
        if len(ops):
            by = ops.groupby([ops["step"].map(step_label), ops["op"].astype(str)])["dur_ns"].sum()
            for label, g in by.groupby(level=0):
                total = g.sum()
                top[str(label)] = (str(g.idxmax()[1]), float(g.max() / total) if total else 0.0)
    out = []
    for p in parts:
        label = str(p.get("label", ""))
        n, dur, tokens = 0, 0, 0
        if label in per.index:
            n = int(per.loc[label, ("dur_ns", "count")])
            dur = int(per.loc[label, ("dur_ns", "sum")])
            tokens = int(per.loc[label, ("n_tokens", "sum")])
        top_op, top_share = top.get(label, ("", 0.0))
        out.append(
            {
                "label": label,
                "steps": n,
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
