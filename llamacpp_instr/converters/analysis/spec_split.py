"""The steps of a speculating session's target and of its draft told apart, for every figure made
from them (``split``), and what its drafts cost and saved (``price``, ``totals``: the figures are
``session.speculation``'s)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from ..session.speculation import (
    Price,
    SpecTotals,
    by_request,
    draft_steps,
    session_totals,
    speculating,
    verify_tokens,
)

if TYPE_CHECKING:
    from .frames import SessionFrames


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
    """The target's steps and the draft's (None for a session that did not speculate), made once
    per session's tables: every section of a report that needs it (the overview, the charts, the
    speculation's, the work between steps, the price) takes the one kept on ``f``, for as long
    as its steps table is the same one."""
    kept = f.__dict__.get("_spec_split")
    if kept is not None and kept[0] is f.steps:
        return kept[1]  # type: ignore[no-any-return]
    made = _split(f)
    f.__dict__["_spec_split"] = (f.steps, made)
    return made


def _split(f: SessionFrames) -> Split | None:
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
