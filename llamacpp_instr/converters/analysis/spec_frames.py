"""Speculative decoding as tables (``load_session(...).contexts``, ``.spec``, the steps' ``role``
and the requests' ``spec_*`` columns), and the steps of the target and of its draft told apart for
every figure made from them (``split``). The figures themselves are ``session.speculation``'s.

* ``contexts`` — one row per ``context`` record: ctx, role (target or draft), model (its name),
  n_layer, n_params, size_bytes, n_ctx, spec_type and spec_n_max (the target's: how it
  speculates).
* ``spec`` — one row per ``spec`` record (a slot's draft verified by one target step): request,
  slot, type, ctx, step (the target's verify step), draft_ctx, draft_first and draft_last (the
  draft's steps that made it), catchup_step, drafted, accepted, rejected_at (the first rejected
  position; null: all accepted), t_draft, draft_dur, draft_ns, t_verify, verify_dur, verify_ns,
  rejected_ns (ns; ``*_dur`` the round's and the step's whole time, ``*_ns`` this slot's share).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..reading.decode.sessions import SessionInfo
from ..session.speculation import (
    Price,
    SpecTotals,
    by_request,
    draft_steps,
    roles,
    session_totals,
    speculating,
    verify_tokens,
)
from .columns import Table, string_categories

if TYPE_CHECKING:
    from .frames import SessionFrames

CONTEXT_COLS = "ctx role model n_layer n_params size_bytes n_ctx spec_type spec_n_max".split()
SPEC_COLS = (
    "request slot type ctx step draft_ctx draft_first draft_last catchup_step drafted accepted "
    "rejected_at t_draft draft_dur draft_ns t_verify verify_dur verify_ns rejected_ns"
).split()
# a request record's ``spec`` object (the server's own counts), as the requests table's columns
REQUEST_SPEC = {
    "spec_drafted": "drafted",
    "spec_accepted": "accepted",
    "spec_verify_steps": "verify_steps",
    "spec_draft_ns": "draft_ns",
    "spec_verify_ns": "verify_ns",
    "spec_rejected_ns": "rejected_ns",
}


def contexts_frame(info: SessionInfo) -> pd.DataFrame:
    t = Table(
        "ctx n_layer n_params size_bytes n_ctx spec_n_max",
        cats="role model spec_type",
        nullable="n_layer n_params size_bytes n_ctx spec_n_max",
    )
    for ctx, c in sorted(info.contexts.items()):
        m, spec = c["model"], c["spec"]
        t.add(
            ctx=ctx, role=c["role"], model=m.get("name") or m.get("desc"),
            n_layer=m.get("n_layer"), n_params=m.get("n_params"), size_bytes=m.get("size_bytes"),
            n_ctx=c["n_ctx"], spec_type=spec.get("type") or None, spec_n_max=spec.get("n_max"),
        )  # fmt: skip
    df = t.frame(CONTEXT_COLS)
    for col in ("role", "model", "spec_type"):
        df[col] = string_categories(df[col])
    return df


def verify_frame(info: SessionInfo) -> pd.DataFrame:
    t = Table(
        "slot ctx step draft_ctx draft_first draft_last catchup_step drafted accepted rejected_at "
        "t_draft draft_dur draft_ns t_verify verify_dur verify_ns rejected_ns",
        cats="request type",
        nullable="step draft_ctx draft_first draft_last catchup_step rejected_at",
    )
    for v in info.verifies:
        t.add(
            request=v.request, slot=v.slot, type=v.type, ctx=v.ctx, step=v.step,
            draft_ctx=v.draft_ctx, draft_first=v.draft_first, draft_last=v.draft_last,
            catchup_step=v.catchup_step, drafted=v.drafted, accepted=v.accepted,
            rejected_at=v.rejected_at, t_draft=v.t_draft, draft_dur=v.draft_dur,
            draft_ns=v.draft_ns, t_verify=v.t_verify, verify_dur=v.verify_dur,
            verify_ns=v.verify_ns, rejected_ns=v.rejected_ns,
        )  # fmt: skip
    df = t.frame(SPEC_COLS)
    for col in ("request", "type"):
        df[col] = string_categories(df[col])
    return df


def step_roles(steps: pd.DataFrame, info: SessionInfo) -> pd.Series:
    """Each step's context's role ("target", "draft"; missing where the log does not say)."""
    of = roles(info)
    col = pd.Categorical(
        [of.get(int(c)) for c in steps["ctx"]] if of else [None] * len(steps),
        categories=[r for r in ("target", "draft") if r in of.values()],
    )
    return string_categories(pd.Series(col, index=steps.index))


def request_spec_columns(requests: list[dict[str, Any]]) -> dict[str, pd.Series]:
    """The requests table's ``spec_*`` columns, from each record's ``spec`` object (null where it
    has none): the server's own counts of its drafts."""
    out: dict[str, Any] = {}
    specs = [r.get("spec") if isinstance(r.get("spec"), dict) else None for r in requests]
    for col, key in REQUEST_SPEC.items():
        out[col] = pd.array([None if s is None else s.get(key) for s in specs], dtype="Int64")
    out["spec_type"] = string_categories(
        pd.Series([None if s is None else str(s.get("type", "")) for s in specs], dtype="category")
    )
    return out


@dataclass
class Split:
    """A speculating session's steps, the target's and the draft's apart."""

    prompt: pd.DataFrame  # the target's prompt steps (its verify steps are generation)
    gen: pd.DataFrame  # the target's generation steps: its verify steps and single-token steps
    gen_tokens: int  # the tokens they gave: a verify's accepted ones and its own, 1 per other
    draft: pd.DataFrame  # every step of the draft
    draft_gen_ns: (
        int  # drafting for the verifies (and taking their batches in), as the server timed it
    )
    draft_other_ns: int  # the draft's steps no verify names (taking prompts in)
    single: pd.DataFrame  # the target's single-token generation steps (no draft)

    @property
    def gen_ns(self) -> int:
        return int(self.gen["dur_ns"].sum())


def split(f: SessionFrames) -> Split | None:
    """The target's steps and the draft's (None for a session that did not speculate)."""
    info = f.info
    if not speculating(info) or "role" not in f.steps:
        return None
    steps = f.steps
    role = steps["role"].astype(object)
    produced = verify_tokens(info.verifies)
    verify = steps["step"].isin(list(produced)) & (role == "target")
    target = steps[(role == "target").to_numpy()]
    is_verify = verify[target.index]
    gen_mask = is_verify | (target["kind"] == "gen")
    gen = target[gen_mask.to_numpy()]
    single = target[((~is_verify) & (target["kind"] == "gen") & (target["n_tokens"] == 1))]
    draft = steps[(role == "draft").to_numpy()]
    named = draft_steps(info.verifies)
    # the server's own time of each round (its sampling too), as the verifies share it out
    draft_gen_ns = sum(v.draft_ns for v in info.verifies)
    draft_other_ns = int(draft.loc[~draft["step"].isin(list(named)), "dur_ns"].sum())
    gen_tokens = sum(produced.values()) + int(
        gen.loc[~is_verify[gen.index].to_numpy(), "n_tokens"].sum()
    )
    return Split(
        prompt=target[~gen_mask.to_numpy()],
        gen=gen,
        gen_tokens=gen_tokens,
        draft=draft,
        draft_gen_ns=draft_gen_ns,
        draft_other_ns=draft_other_ns,
        single=single,
    )


# a price of one plain token from elsewhere (the CLI's: predict's model), when the log has none
ModelPrice = Callable[["SessionFrames"], Price | None]


def price(f: SessionFrames, model: ModelPrice | None = None) -> Price | None:
    """What one token of a plain decode costs the target: the median of the log's single-token
    target steps, or ``model``'s price where there are none."""
    sp = split(f)
    if sp is None:
        return None
    found = Price.from_steps(sp.single["dur_ns"].astype("int64").tolist())
    if found is None and model is not None:
        found = model(f)
    return found


def totals(
    f: SessionFrames, model: ModelPrice | None = None
) -> tuple[SpecTotals, list[SpecTotals]] | None:
    """The session's speculation summed, and each request's (None: it verified no draft)."""
    if not f.info.verifies:
        return None
    p = price(f, model)
    return session_totals(f.info.verifies, p), by_request(f.info.verifies, p)
