"""Speculative decoding as tables (``load_session(...).contexts``, ``.spec``, the steps' ``role``
and the requests' ``spec_*`` columns). The figures themselves are ``session.speculation``'s; the
target's steps told apart from the draft's are ``spec_split``'s.

* ``contexts`` — one row per ``context`` record: ctx, role (target, draft, or an image or sound
  encoder's), model (its name; an encoder's projector type),
  n_layer, n_params, size_bytes, n_ctx, spec_type and spec_n_max (the target's: how it
  speculates).
* ``spec`` — one row per ``spec`` record (a slot's draft verified by one target step): request,
  slot, type, ctx, step (the target's verify step), draft_ctx, draft_first and draft_last (the
  draft's steps that made it), catchup_step, drafted, accepted, rejected_at (the first rejected
  position; null: all accepted), t_draft, draft_dur, draft_ns, t_verify, verify_dur, verify_ns,
  rejected_ns (ns; ``*_dur`` the round's and the step's whole time, ``*_ns`` this slot's share).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..reading.decode.sessions import SessionInfo
from ..session.speculation import roles
from .table_columns import Table, string_categories

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
            ctx=ctx, role=c["role"],
            model=m.get("name") or m.get("desc") or m.get("architecture"),  # (an encoder's)
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
