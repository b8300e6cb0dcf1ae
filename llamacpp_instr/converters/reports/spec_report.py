"""Speculative decoding in the reports: the summary's draft line and verdict, its section (acceptance
by draft position, time by draft, verify and rejected work, each request's verdict), and the
columns ``instr requests`` adds. The figures are ``session.speculation``'s, over the tables of
``analysis.spec_split``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..analysis import spec_split
from ..session.speculation import SpecTotals, model_name, roles
from .report import Chart, Column, Fact, Section, Series, Table

if TYPE_CHECKING:
    from ..analysis.frames import SessionFrames

CHARTED = 20  # requests drawn in the HTML report

REQUEST_COLUMNS = [
    Column("id", "request"),
    Column("type", "speculation"),
    Column("verify_steps", "verify steps", "int"),
    Column("drafted", "drafted", "int"),
    Column("accepted", "accepted", "int"),
    Column("acceptance", "acceptance", "pct"),
    Column("draft_ms", "draft (ms)", "f1"),
    Column("verify_ms", "verify (ms)", "f1"),
    Column("rejected_ms", "on rejected tokens (ms)", "f1"),
    Column("saved_ms", "saved (ms)", "f1"),
    Column("verdict", "verdict"),
]


def _target_ctx(f: SessionFrames) -> tuple[int | None, int | None]:
    by_role = {r: c for c, r in roles(f.info).items()}
    return by_role.get("target"), by_role.get("draft")


def overview(f: SessionFrames, sp: spec_split.Split) -> dict[str, Any]:
    """The overview's ``speculation`` object: the target and its draft apart."""
    tgt, dft = _target_ctx(f)
    spec = f.info.contexts.get(tgt or -1, {}).get("spec", {})
    t = spec_split.totals(f)
    s = t[0] if t else SpecTotals()
    draft_ns = int(sp.draft["dur_ns"].sum())
    return {
        "target_ctx": tgt,
        "target_model": model_name(f.info, tgt) if tgt is not None else "",
        "draft_ctx": dft,
        "draft_model": model_name(f.info, dft) if dft is not None else "",
        "type": spec.get("type") or s.type,
        "n_max": spec.get("n_max"),
        "target_gen_steps": len(sp.gen),
        "target_gen_ms": sp.gen_ns / 1e6,
        "gen_tok_s_target_steps": sp.gen_tokens / (sp.gen_ns / 1e9) if sp.gen_ns else 0.0,
        "draft_steps": len(sp.draft),
        "draft_ms": draft_ns / 1e6,
        "draft_gen_ms": sp.draft_gen_ns / 1e6,
        "draft_prompt_ms": sp.draft_other_ns / 1e6,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance": s.acceptance,
    }


def draft_line(o: dict[str, Any]) -> str:
    """The summary's line for the draft: what it ran and what it cost."""
    what = o["type"] or "speculation"
    who = f"ctx {o['draft_ctx']}" if o["draft_ctx"] is not None else "no draft model"
    if o["draft_model"]:
        who += f", {o['draft_model']}"
    acc = f" ({o['acceptance'] * 100:.0f} %)" if o["acceptance"] is not None else ""
    return (
        f"{what} ({who}): {o['draft_steps']:,} steps of {o['draft_ms']:,.1f} ms; drafting "
        f"{o['draft_gen_ms']:,.1f} ms, prompts {o['draft_prompt_ms']:,.1f} ms; "
        f"{o['drafted']:,} tokens drafted, {o['accepted']:,} accepted{acc}"
    )


def facts(o: dict[str, Any], session: SpecTotals | None) -> list[Fact]:
    """The summary's headline facts of a speculating session."""
    out = [
        Fact("generation tokens/s, the target's steps alone", o["gen_tok_s_target_steps"], "f1"),
        Fact("draft", draft_line(o)),
    ]
    if session is not None and session.verdict():
        out.append(Fact("speculation", f"{session.verdict()}; {session.price.note}"))  # type: ignore[union-attr]
    elif session is not None:
        out.append(Fact("speculation", "not priced: the log has no single-token target step"))
    return out


def section(f: SessionFrames, t: tuple[SpecTotals, list[SpecTotals]]) -> Section:
    """The summary's section: acceptance by position, time by draft, verify and rejected work,
    each request's verdict."""
    session, reqs = t
    by_pos = session.acceptance_by_pos()
    charted = sorted(reqs, key=lambda r: -r.spent_ns)[:CHARTED]
    charts = [
        Chart(
            name="spec_acceptance_by_position",
            kind="bars",
            title="Acceptance by draft position: of the drafts with a token there, the share accepted",
            x_label="accepted",
            y_label="draft position",
            categories=[str(i + 1) for i in range(len(by_pos))],
            series=[Series("acceptance (%)", [100 * x for x in by_pos])],
            value_fmt="f1",
        ),
        Chart(
            name="spec_time",
            kind="stacked",
            title="Each request's speculative work: drafting, verifying (of both, the rejected "
            "tokens' share apart)",
            x_label="ms",
            y_label="request",
            categories=[r.id for r in charted],
            series=[
                Series("draft", [_kept(r.draft_ns, r) / 1e6 for r in charted]),
                Series("verify", [_kept(r.verify_ns, r) / 1e6 for r in charted]),
                Series("rejected", [r.rejected_ns / 1e6 for r in charted]),
            ],
            value_fmt="f1",
        ),
    ]
    return Section(
        "Speculative decoding",
        facts=[
            Fact("verify steps", session.verify_steps, "int"),
            Fact("drafted tokens", session.drafted, "int"),
            Fact("accepted tokens", session.accepted, "int"),
            Fact("acceptance", session.acceptance, "pct"),
            Fact("draft time (ms)", session.draft_ns / 1e6, "f1"),
            Fact("verify time (ms)", session.verify_ns / 1e6, "f1"),
            Fact("time on rejected tokens (ms)", session.rejected_ns / 1e6, "f1"),
            Fact("verdict", session.verdict() or "not priced"),
            *([Fact("priced", session.price.note)] if session.price else []),
        ],
        charts=charts,
        tables=[
            Table(
                "speculation",
                "Speculation per request: did the draft pay?",
                REQUEST_COLUMNS,
                [r.row() for r in reqs],
            )
        ],
    )


def _kept(ns: int, r: SpecTotals) -> float:
    """Of ``ns`` (a request's draft or verify time), the part not on rejected tokens, so that the
    three series stack to the whole: each part keeps its share of the rejected time out."""
    spent = r.spent_ns
    return ns - (r.rejected_ns * ns / spent if spent else 0.0)
