"""The draft's work inside its target's gaps, per gap: a speculating program runs its draft between
two of the target's steps (llama-server drafts while it builds the target's next batch, and takes
the verified tokens into the draft after the target's step), so the target's ``host`` records
hold the draft's time in their program's own work (the ``batch`` part) and in what no hook names.
Every figure that splits a target's gap subtracts this, to show the draft's work once, apart.

A piece of the draft's work is a draft step's decode (at its start), the sampling of each of its
sequences (at its first recorded instant; a record without ``seqs``: at the step's start) and its
recording (at the step's start), each in the target's gap it lies in: from a target step's end to
its context's next step. A piece after the target's last slot work of that gap (its sampled
sequences' last instant) lies in the building of the next batch; one before, in what no hook
names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from .frames import SessionFrames

COLUMNS = ["ctx", "step", "draft_ns", "draft_batch_ns"]


def _pairs(f: SessionFrames) -> dict[int, int]:
    """Each draft context's target, by the ``spec`` records (or the session's only target)."""
    role = f.steps["role"].astype(object)
    targets = sorted(set(f.steps.loc[role == "target", "ctx"]))
    drafts = sorted(set(f.steps.loc[role == "draft", "ctx"]))
    out: dict[int, int] = {}
    for v in f.info.verifies:
        if v.draft_ctx is not None and v.draft_ctx in drafts:
            out.setdefault(int(v.draft_ctx), int(v.ctx))
    if len(targets) == 1:
        for d in drafts:
            out.setdefault(int(d), int(targets[0]))
    return out


def _pieces(f: SessionFrames, draft: int) -> pd.DataFrame:
    """The draft context's pieces of work: (t, ns)."""
    steps = f.steps.loc[f.steps["ctx"] == draft, ["step", "t_start", "dur_ns"]]
    host = f.host.loc[f.host["ctx"] == draft, ["step", "sample_ns", "host_ns"]]
    host = host.merge(steps[["step", "t_start"]], on="step", how="inner")
    seqs = f.host_seqs.loc[
        (f.host_seqs["ctx"] == draft) & (f.host_seqs["sample_ns"] > 0),
        ["step", "t_start", "sample_ns"],
    ]
    # a record's sampling at its sequences' instants where it has them, else at its step's start
    bare = host[~host["step"].isin(seqs["step"])]
    return pd.concat(
        [
            steps[["t_start", "dur_ns"]].set_axis(["t", "ns"], axis=1),
            host[["t_start", "host_ns"]].set_axis(["t", "ns"], axis=1),
            bare[["t_start", "sample_ns"]].set_axis(["t", "ns"], axis=1),
            seqs[["t_start", "sample_ns"]].set_axis(["t", "ns"], axis=1),
        ],
        ignore_index=True,
    ).astype("int64")


def _gaps(f: SessionFrames, target: int) -> pd.DataFrame:
    """The target's gaps: its step, the step's end, its next step's start, and the last instant
    of its sampled sequences' work in the gap (the step's end where none is recorded)."""
    s = f.steps.loc[f.steps["ctx"] == target, ["step", "t_start", "dur_ns"]].sort_values("t_start")
    g = pd.DataFrame(
        {
            "step": s["step"].to_numpy(),
            "end": (s["t_start"] + s["dur_ns"]).to_numpy(),
            "next": s["t_start"].shift(-1).to_numpy(),
        }
    ).dropna()
    q = f.host_seqs
    slots = q[(q["ctx"] == target) & (q["sampled"] > 0)].groupby("step")["t_end"].max()
    g["slots_end"] = g["step"].map(slots).fillna(g["end"]).astype("int64")
    return g.astype({"next": "int64"}).sort_values("end", ignore_index=True)


def draft_in_gaps(f: SessionFrames) -> pd.DataFrame:
    """Per gap of a target (its ``ctx`` and ``step``, as its ``host`` record names it): the ns of
    its draft's work in it, and of which in the building of the next batch (empty for a session
    that did not speculate)."""
    if f.steps.empty or "role" not in f.steps:
        return pd.DataFrame(columns=COLUMNS)
    frames = []
    for draft, target in _pairs(f).items():
        gaps, pieces = _gaps(f, target), _pieces(f, draft)
        if gaps.empty or pieces.empty:
            continue
        i = np.searchsorted(gaps["end"].to_numpy(), pieces["t"].to_numpy(), side="right") - 1
        inside = i >= 0
        inside[inside] &= pieces["t"].to_numpy()[inside] < gaps["next"].to_numpy()[i[inside]]
        p, at = pieces[inside], i[inside]
        batch = p["t"].to_numpy() > gaps["slots_end"].to_numpy()[at]
        frames.append(
            pd.DataFrame(
                {"ctx": target, "step": gaps["step"].to_numpy()[at], "draft_ns": p["ns"]}
            ).assign(draft_batch_ns=np.where(batch, p["ns"].to_numpy(), 0))
        )
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.concat(frames, ignore_index=True).groupby(["ctx", "step"], as_index=False).sum()
    return out[COLUMNS].astype("int64")
