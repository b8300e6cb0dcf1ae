"""A token's time from one decode to the next, what happens between steps included (the summary's
"A token's time" section; the devices' ``token_time`` table is another thing: a step's window on
several devices): each kind
of step's decode time, the sampling of its outputs (its costliest samplers), the grammar, the
program's own work, the recording's, and what no hook names, from the ``host`` records
(``load_session(...).host``, ``.samplers``). A speculating session's draft steps are their own
kinds, and its target's verify steps theirs, so that the draft's sampling stays apart from the
target's; the draft's work inside the target's gaps (``draft_in_gaps``: llama-server drafts while
it builds the target's next batch) is the target's "draft" figure, out of its program's own work
and its unrecorded time, and a draft's gap ends where its target's next step begins. An image's or
a sound's encodes in a step's gap (mtmd's: another context's, outside ``llama_decode``) are its
"encode" figure, out of its unrecorded time and out of its token's time.

Every figure is a sum of measured times: decode is ``llama_decode``'s, sampling the sampling
scopes', the rest the parts the program names; "unrecorded" is the gap from a step's end to its
context's next step less all of those (a thread waiting for work, for a lock or for a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analysis import spec_split
from ..analysis.draft_in_gaps import draft_in_gaps
from ..reading.decode.host import sampler_type
from .report import Column, Fact, Section, Table

if TYPE_CHECKING:
    from ..analysis.frames import SessionFrames

TOP_SAMPLERS = 8  # the samplers the section names, costliest first
RECORDING = ("log", "log-begin")  # the instrumentation's own parts of the host's work


@dataclass
class StepKindTime:
    """One kind of step's time, summed over its steps (ns)."""

    kind: str  # prompt, gen; a speculating session's: verify, "draft prompt", "draft gen"
    steps: int
    tokens: int  # the tokens its batches decoded
    sampled: int  # the outputs sampled after them
    decode_ns: int
    sampling_ns: int  # the sampling scopes, end to end (the grammar's passes included)
    grammar_ns: int  # of which the grammar's
    program_ns: int  # the program's own work (detokenizing, stop checks, the next batch, ...)
    recording_ns: int  # the instrumentation's own (writing the step's records)
    unrecorded_ns: int  # the gaps to the context's next step less all of the above
    draft_ns: int = 0  # a target's: its draft's decode, sampling and recording in its gaps
    encode_ns: int = 0  # the encodes of images or sounds in its gaps (no token's time)

    def row(self, encodes: bool = False) -> dict[str, Any]:
        total = (
            self.decode_ns
            + self.sampling_ns
            + self.program_ns
            + self.recording_ns
            + self.unrecorded_ns
            + self.draft_ns
        )
        per = max(self.tokens, 1)
        return {
            "kind": self.kind,
            "steps": self.steps,
            "tokens": self.tokens,
            "sampled": self.sampled,
            **{
                f"{k}_ms": getattr(self, f"{k}_ns") / 1e6
                for k in (
                    "decode",
                    "sampling",
                    "grammar",
                    "program",
                    "recording",
                    "unrecorded",
                    "draft",
                )
            },
            "per_token_ms": total / per / 1e6,
            "sampling_share": self.sampling_ns / total if total else 0.0,
            **({"encode_ms": self.encode_ns / 1e6} if encodes else {}),
        }


@dataclass
class BetweenSteps:
    kinds: list[StepKindTime]
    samplers: list[dict[str, Any]]  # the target's samplers, costliest first
    draft_samplers: list[dict[str, Any]] = field(default_factory=list)
    gen_tokens: int | None = None  # a speculating session's: the tokens its generation steps gave
    detailed: bool = False  # whether the records name each sampler (DETAILED and above)
    encodes: bool = False  # whether images or sounds were encoded in the gaps

    def row(self) -> dict[str, Any]:
        return {
            "kinds": [k.row(self.encodes) for k in self.kinds],
            "samplers": self.samplers,
            "draft_samplers": self.draft_samplers,
        }


def _step_kinds(f: SessionFrames) -> pd.DataFrame:
    """The steps with the kind the section groups them by, and the gap to their context's next
    step (NaN for a context's last). A step each of whose tokens was sampled after it is
    generation, whatever its kind: a server's batch of several slots' tokens is "prompt" by its
    size alone; a target's step that verified a draft is "verify". A draft's gap ends where the
    next of the other contexts' steps begins: the rest is theirs."""
    s = f.steps[["ctx", "step", "kind", "t_start", "dur_ns", "n_tokens"]].copy()
    sampled = s.merge(f.host[["ctx", "step", "sampled"]], on=["ctx", "step"], how="left")
    every = (sampled["sampled"].to_numpy() == s["n_tokens"].to_numpy()) & (
        s["n_tokens"].to_numpy() > 0
    )
    kind = s["kind"].astype(str).where(~every, "gen")
    draft = np.zeros(len(s), dtype=bool)
    if "role" in f.steps:
        draft = (f.steps["role"].astype(object) == "draft").to_numpy()
        verify = ~draft & s["step"].isin(f.spec["step"] if not f.spec.empty else []).to_numpy()
        kind = kind.where(~verify, "verify").where(~draft, "draft " + kind)
    s["group"] = kind
    end = s["t_start"] + s["dur_ns"]
    s = s.assign(_draft=draft).sort_values(["ctx", "t_start"])
    nxt = s.groupby("ctx")["t_start"].shift(-1)
    if draft.any():
        others = np.sort(s.loc[~s["_draft"], "t_start"].to_numpy())
        at = np.searchsorted(others, end[s.index].to_numpy(), side="right")
        first = np.append(others, np.nan)[at]
        nxt = nxt.where(~s["_draft"] | ~((first < nxt) | nxt.isna()), first)
    s["gap"] = nxt - end[s.index]
    return s.drop(columns="_draft")


def _sampler_rows(parts: pd.DataFrame, sampling_ns: int) -> list[dict[str, Any]]:
    if parts.empty:
        return []
    kinds, names = parts["kind"].astype(str), parts["sampler"].astype(str)
    label = [
        f"grammar: {n}" if k == "grammar" else (sampler_type(k, n) or "")
        for k, n in zip(kinds, names, strict=True)
    ]
    g = parts.assign(label=label).groupby("label")[["ns", "n"]].sum()
    g = g.sort_values("ns", ascending=False).head(TOP_SAMPLERS)
    return [
        {
            "sampler": str(name),
            "total_ms": int(ns) / 1e6,
            "runs": int(n),
            "per_run_us": int(ns) / max(int(n), 1) / 1e3,
            "share": int(ns) / sampling_ns if sampling_ns else 0.0,
        }
        for name, ns, n in g[["ns", "n"]].itertuples()
    ]


def between_steps(f: SessionFrames) -> BetweenSteps | None:
    """The session's token time by kind of step; None for a log without ``host`` records."""
    if f.host.empty or f.steps.empty:
        return None
    steps = _step_kinds(f)
    host = _less_the_draft(
        f.host.merge(steps[["ctx", "step", "group", "gap"]], on=["ctx", "step"], how="inner"), f
    )
    parts = f.samplers
    if not parts.empty:
        parts = parts.merge(steps[["ctx", "step", "group"]], on=["ctx", "step"], how="inner")
    kinds: list[StepKindTime] = []
    for group in sorted(steps["group"].unique(), key=_kind_order):
        st, h = steps[steps["group"] == group], host[host["group"] == group]
        p = parts[parts["group"] == group] if not parts.empty else parts
        grammar = _grammar_ns(p)
        recording = int(p.loc[_is_recording(p), "ns"].sum()) if not p.empty else 0
        unrecorded = h["unrecorded"].sum() - h["draft_rest"].sum() - h["encode"].sum()
        kinds.append(
            StepKindTime(
                kind=group,
                steps=len(st),
                tokens=int(st["n_tokens"].sum()),
                sampled=int(h["sampled"].sum()),
                decode_ns=int(st["dur_ns"].sum()),
                sampling_ns=int(h["sample_ns"].sum()),
                grammar_ns=grammar,
                program_ns=int(h["host_ns"].sum() - h["draft_batch"].sum()) - recording,
                recording_ns=recording,
                unrecorded_ns=int(unrecorded),
                draft_ns=int(h["draft_batch"].sum() + h["draft_rest"].sum()),
                encode_ns=int(h["encode"].sum()),
            )
        )
    sampling = (
        parts[parts["kind"].astype(str).isin(["sampler", "grammar", "sampling"])]
        if (not parts.empty)
        else parts
    )
    draft = sampling["group"].str.startswith("draft") if not sampling.empty else None
    target_ns = sum(k.sampling_ns for k in kinds if not k.kind.startswith("draft"))
    draft_ns = sum(k.sampling_ns for k in kinds if k.kind.startswith("draft"))
    return BetweenSteps(
        kinds=kinds,
        samplers=_sampler_rows(sampling[~draft] if draft is not None else sampling, target_ns),
        draft_samplers=_sampler_rows(sampling[draft], draft_ns) if draft is not None else [],
        detailed=not f.samplers.empty,
        gen_tokens=sp.gen_tokens if (sp := spec_split.split(f)) is not None else None,
        encodes=not f.encodes.empty,
    )


def _less_the_draft(host: pd.DataFrame, f: SessionFrames) -> pd.DataFrame:
    """``host`` (its rows with their ``gap``) with each record's unrecorded ns, and the draft's
    work in the gap (``draft_in_gaps``) as it comes out of the program's own work (``draft_batch``,
    at most that) and out of the unrecorded ns (``draft_rest``, at most those)."""
    d = draft_in_gaps(f)
    h = host.merge(d, on=["ctx", "step"], how="left") if not d.empty else host
    draft = h.get("draft_ns", pd.Series(0, index=h.index)).fillna(0)
    batch = h.get("draft_batch_ns", pd.Series(0, index=h.index)).fillna(0)
    unrecorded = (h["gap"] - h["sample_ns"] - h["host_ns"]).clip(lower=0).fillna(0)
    out_batch = np.minimum(batch, h["host_ns"])
    rest = np.minimum(draft - out_batch, unrecorded)
    encode = np.minimum(_encodes_in_gaps(host, f), unrecorded - rest)
    return host.assign(
        unrecorded=unrecorded.to_numpy(),
        draft_batch=out_batch.to_numpy(),
        draft_rest=rest.to_numpy(),
        encode=encode.to_numpy(),
    )


def _encodes_in_gaps(host: pd.DataFrame, f: SessionFrames) -> pd.Series:
    """Per row of ``host`` (with its step's ``gap``), the time of the encodes that began in the
    gap after its step, from the step's end to its context's next step (0 without encodes)."""
    enc = f.encodes
    if enc.empty:
        return pd.Series(0, index=host.index, dtype="int64")
    enc = enc.sort_values("t_start")
    starts = enc["t_start"].to_numpy(np.int64)
    done = np.concatenate(([0], np.cumsum(enc["dur_ns"].to_numpy(np.int64))))
    ends = host[["ctx", "step"]].merge(
        f.steps[["ctx", "step", "t_start", "dur_ns"]], on=["ctx", "step"], how="left"
    )
    end = (ends["t_start"] + ends["dur_ns"]).to_numpy(np.float64)
    nxt = end + host["gap"].to_numpy(np.float64)
    ok = ~np.isnan(nxt)
    lo = np.searchsorted(starts, np.where(ok, end, 0), side="left")
    hi = np.searchsorted(starts, np.where(ok, nxt, 0), side="left")
    return pd.Series(np.where(ok, done[hi] - done[lo], 0), index=host.index, dtype="int64")


def _kind_order(kind: str) -> tuple[bool, int]:
    base = kind.removeprefix("draft ")
    return kind.startswith("draft"), {"prompt": 0, "gen": 1, "verify": 2}.get(base, 3)


def _grammar_ns(p: pd.DataFrame) -> int:
    """The grammar's time: its passes outside the chain, and the chain's own grammar sampler."""
    if p.empty:
        return 0
    kind, name = p["kind"].astype(str), p["sampler"].astype(str)
    mask = (kind == "grammar") | ((kind == "sampler") & (name.str.lstrip("?+") == "grammar"))
    return int(p.loc[mask, "ns"].sum())


def _is_recording(p: pd.DataFrame) -> pd.Series:
    return (p["kind"].astype(str) == "host") & p["sampler"].astype(str).isin(RECORDING)


KIND_COLUMNS = [
    Column("kind", "kind of step"),
    Column("steps", "steps", "int"),
    Column("tokens", "tokens", "int"),
    Column("decode_ms", "decode (ms)", "f2"),
    Column("sampling_ms", "sampling (ms)", "f2"),
    Column("grammar_ms", "of which grammar (ms)", "f2"),
    Column("program_ms", "program's own work (ms)", "f2"),
    Column("recording_ms", "recording (ms)", "f2"),
    Column("unrecorded_ms", "unrecorded (ms)", "f2"),
    Column("draft_ms", "draft (ms)", "f2"),
    Column("per_token_ms", "per token (ms)", "f3"),
    Column("sampling_share", "sampling share", "pct"),
]
ENCODE_COLUMN = Column("encode_ms", "encode (ms)", "f2")
SAMPLER_COLUMNS = [
    Column("sampler", "sampler"),
    Column("total_ms", "total (ms)", "f2"),
    Column("runs", "runs", "int"),
    Column("per_run_us", "per run (µs)", "f1"),
    Column("share", "share of sampling", "pct"),
]


def _headline(t: BetweenSteps) -> str:
    """A generated token of the target, in one line: its generation steps' figures (a
    speculating session's verify steps too) over the tokens they gave."""
    gen = [k for k in t.kinds if k.kind in ("gen", "verify")]
    n = t.gen_tokens if t.gen_tokens is not None else sum(k.tokens for k in gen)
    if not gen or not n:
        return ""

    def per(what: str) -> str:
        return f"{sum(getattr(k, f'{what}_ns') for k in gen) / n / 1e6:,.3f} ms"

    top = f" (most: {t.samplers[0]['sampler']})" if t.samplers else ""
    draft = f", the draft {per('draft')}" if any(k.draft_ns for k in gen) else ""
    return (
        f"decode {per('decode')}, sampling {per('sampling')}{top}, grammar {per('grammar')}, "
        f"the program's own work {per('program')}, recording {per('recording')}, "
        f"unrecorded {per('unrecorded')}{draft}"
    )


def section(t: BetweenSteps) -> Section:
    """The summary's section: a generated token in one line, each kind of step, the samplers."""
    facts = [Fact("a generated token", line)] if (line := _headline(t)) else []
    encode = " encode: the encodes of images or sounds in the gaps (no token's time);"
    tables = [
        Table(
            "between_steps",
            "A token's time by kind of step, from one decode to the context's next",
            KIND_COLUMNS + ([ENCODE_COLUMN] if t.encodes else []),
            [k.row(t.encodes) for k in t.kinds],
            note="sampling: the sampling scopes end to end (the grammar's passes included); "
            "recording: writing the step's records; unrecorded: the rest of the gap to the "
            "context's next step (waiting for work, a lock or a CPU); draft: the draft's "
            "decode, sampling and recording in the target's gaps (a draft's rows: the same "
            "work by kind of step; a draft's gap ends at its target's next step)"
            + (f";{encode[:-1]}" if t.encodes else ""),
        )
    ]
    if t.samplers:
        tables.append(Table("samplers", "The costliest samplers", SAMPLER_COLUMNS, t.samplers))
    if t.draft_samplers:
        tables.append(
            Table("draft_samplers", "The draft's samplers", SAMPLER_COLUMNS, t.draft_samplers)
        )
    text = "" if t.detailed else "each sampler is recorded at --level detailed; totals only here"
    return Section("A token's time", facts=facts, tables=tables, text=text)
