"""A token's time from one decode to the next, what happens between steps included (the summary's
"A token's time" section; the devices' ``token_time`` table is another thing: a step's window on
several devices): each kind
of step's decode time, the sampling of its outputs (its costliest samplers), the grammar, the
program's own work, the recording's, and what no hook names, from the ``host`` records
(``load_session(...).host``, ``.samplers``). A speculating session's draft steps are their own
kind, so that the draft's sampling stays apart from the target's.

Every figure is a sum of measured times: decode is ``llama_decode``'s, sampling the sampling
scopes', the rest the parts the program names; "unrecorded" is the gap from a step's end to its
context's next step less all of those (a thread waiting for work, for a lock or for a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..reading.decode.host import sampler_type
from .report import Column, Fact, Section, Table

if TYPE_CHECKING:
    from ..analysis.frames import SessionFrames

TOP_SAMPLERS = 8  # the samplers the section names, costliest first
RECORDING = ("log", "log-begin")  # the instrumentation's own parts of the host's work


@dataclass
class StepKindTime:
    """One kind of step's time, summed over its steps (ns)."""

    kind: str  # prompt, gen; a speculating session's draft steps: "draft prompt", "draft gen"
    steps: int
    tokens: int  # the tokens its batches decoded
    sampled: int  # the outputs sampled after them
    decode_ns: int
    sampling_ns: int  # the sampling scopes, end to end (the grammar's passes included)
    grammar_ns: int  # of which the grammar's
    program_ns: int  # the program's own work (detokenizing, stop checks, the next batch, ...)
    recording_ns: int  # the instrumentation's own (writing the step's records)
    unrecorded_ns: int  # the gaps to the context's next step less all of the above

    def row(self) -> dict[str, Any]:
        total = (
            self.decode_ns
            + self.sampling_ns
            + self.program_ns
            + self.recording_ns
            + self.unrecorded_ns
        )
        per = max(self.tokens, 1)
        return {
            "kind": self.kind,
            "steps": self.steps,
            "tokens": self.tokens,
            "sampled": self.sampled,
            **{
                f"{k}_ms": getattr(self, f"{k}_ns") / 1e6
                for k in ("decode", "sampling", "grammar", "program", "recording", "unrecorded")
            },
            "per_token_ms": total / per / 1e6,
            "sampling_share": self.sampling_ns / total if total else 0.0,
        }


@dataclass
class BetweenSteps:
    kinds: list[StepKindTime]
    samplers: list[dict[str, Any]]  # the target's samplers, costliest first
    draft_samplers: list[dict[str, Any]] = field(default_factory=list)
    detailed: bool = False  # whether the records name each sampler (DETAILED and above)

    def row(self) -> dict[str, Any]:
        return {
            "kinds": [k.row() for k in self.kinds],
            "samplers": self.samplers,
            "draft_samplers": self.draft_samplers,
        }


def _step_kinds(f: SessionFrames) -> pd.DataFrame:
    """The steps with the kind the section groups them by, and the gap to their context's next
    step (NaN for a context's last). A step each of whose tokens was sampled after it is
    generation, whatever its kind: a server's batch of several slots' tokens is "prompt" by its
    size alone."""
    s = f.steps[["ctx", "step", "kind", "t_start", "dur_ns", "n_tokens"]].copy()
    sampled = s.merge(f.host[["ctx", "step", "sampled"]], on=["ctx", "step"], how="left")
    every = (sampled["sampled"].to_numpy() == s["n_tokens"].to_numpy()) & (
        s["n_tokens"].to_numpy() > 0
    )
    kind = s["kind"].astype(str).where(~every, "gen")
    if "role" in f.steps:
        draft = (f.steps["role"].astype(object) == "draft").to_numpy()
        kind = kind.where(~draft, "draft " + kind)
    s["group"] = kind
    s = s.sort_values(["ctx", "t_start"])
    nxt = s.groupby("ctx")["t_start"].shift(-1)
    s["gap"] = nxt - (s["t_start"] + s["dur_ns"])
    return s


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
    host = f.host.merge(steps[["ctx", "step", "group", "gap"]], on=["ctx", "step"], how="inner")
    parts = f.samplers
    if not parts.empty:
        parts = parts.merge(steps[["ctx", "step", "group"]], on=["ctx", "step"], how="inner")
    kinds: list[StepKindTime] = []
    for group in sorted(steps["group"].unique(), key=_kind_order):
        st, h = steps[steps["group"] == group], host[host["group"] == group]
        p = parts[parts["group"] == group] if not parts.empty else parts
        grammar = _grammar_ns(p)
        recording = int(p.loc[_is_recording(p), "ns"].sum()) if not p.empty else 0
        recorded = h["sample_ns"] + h["host_ns"]
        unrecorded = (h["gap"] - recorded).clip(lower=0).fillna(0).sum()
        kinds.append(
            StepKindTime(
                kind=group,
                steps=len(st),
                tokens=int(st["n_tokens"].sum()),
                sampled=int(h["sampled"].sum()),
                decode_ns=int(st["dur_ns"].sum()),
                sampling_ns=int(h["sample_ns"].sum()),
                grammar_ns=grammar,
                program_ns=int(h["host_ns"].sum()) - recording,
                recording_ns=recording,
                unrecorded_ns=int(unrecorded),
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
    )


def _kind_order(kind: str) -> tuple[bool, int]:
    base = kind.removeprefix("draft ")
    return kind.startswith("draft"), {"prompt": 0, "gen": 1}.get(base, 2)


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
    Column("per_token_ms", "per token (ms)", "f3"),
    Column("sampling_share", "sampling share", "pct"),
]
SAMPLER_COLUMNS = [
    Column("sampler", "sampler"),
    Column("total_ms", "total (ms)", "f2"),
    Column("runs", "runs", "int"),
    Column("per_run_us", "per run (µs)", "f1"),
    Column("share", "share of sampling", "pct"),
]


def _headline(t: BetweenSteps) -> str:
    """A generated token of the target, in one line."""
    gen = next((k for k in t.kinds if k.kind == "gen"), None)
    if gen is None or not gen.tokens:
        return ""
    n = gen.tokens
    top = f" (most: {t.samplers[0]['sampler']})" if t.samplers else ""
    return (
        f"decode {gen.decode_ns / n / 1e6:,.3f} ms, sampling {gen.sampling_ns / n / 1e6:,.3f} ms"
        f"{top}, grammar {gen.grammar_ns / n / 1e6:,.3f} ms, the program's own work "
        f"{gen.program_ns / n / 1e6:,.3f} ms, recording {gen.recording_ns / n / 1e6:,.3f} ms, "
        f"unrecorded {gen.unrecorded_ns / n / 1e6:,.3f} ms"
    )


def section(t: BetweenSteps) -> Section:
    """The summary's section: a generated token in one line, each kind of step, the samplers."""
    facts = [Fact("a generated token", line)] if (line := _headline(t)) else []
    tables = [
        Table(
            "between_steps",
            "A token's time by kind of step, from one decode to the context's next",
            KIND_COLUMNS,
            [k.row() for k in t.kinds],
            note="sampling: the sampling scopes end to end (the grammar's passes included); "
            "recording: writing the step's records; unrecorded: the rest of the gap to the "
            "context's next step (waiting for work, a lock or a CPU)",
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
