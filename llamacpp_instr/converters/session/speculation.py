"""Speculative decoding, figured once for every reader: which context is the target and which its
draft, what each request's drafts cost, and whether they paid.

llama-server (patch 0005) writes a ``context`` record per context (its model and role) and a
``spec`` record per verify step of a slot (``reading.decode.spec.Verify``): the tokens
drafted and accepted, the draft's steps that made them, the target's step that verified them, and
the time of each, shared out between the slots a round or a step served. A request's figures are
the sums of its verifies'.

**The verdict.** A verify that accepted ``a`` of its ``d`` drafted tokens gave the request ``a + 1``
tokens, for its drafting and its verify step. A plain decode would have given each of those tokens
a single-token step of the target: the verdict prices them so, from the log's own single-token
steps of the target (their median), or, where the log has none, from ``predict``'s model of one
(``Price``), and says which. Speculation saved ``plain - (draft + verify)``, or cost the
difference. The target's single-token steps the request had anyway (no draft: the last token, an
empty draft) are the same either way and are left out of both.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..reading.decode.sessions import SessionInfo
from ..reading.decode.spec import Verify


def roles(info: SessionInfo) -> dict[int, str]:
    """Each context's role ("target" or "draft"), by ctx: the ``context`` records', else what the
    ``spec`` records name (their ``ctx`` verified, their ``draft_ctx`` drafted)."""
    out = {c: str(rec["role"]) for c, rec in info.contexts.items()}
    for v in info.verifies:
        out.setdefault(v.ctx, "target")
        if v.draft_ctx is not None:
            out.setdefault(v.draft_ctx, "draft")
    return out


def speculating(info: SessionInfo) -> bool:
    """Did the session speculate (a draft context, a target that says how, or a verify)?"""
    return bool(info.verifies) or any(
        c["role"] == "draft" or c.get("spec") for c in info.contexts.values()
    )


def model_name(info: SessionInfo, ctx: int) -> str:
    """The name of a context's model, as its ``context`` record gives it ("" when none does)."""
    m = info.contexts.get(ctx, {}).get("model", {})
    return str(m.get("name") or m.get("desc") or "")


@dataclass(frozen=True)
class Price:
    """What one token of a plain decode costs the target, and where that figure comes from."""

    ns: float
    source: str  # "log" (its single-token steps) or "predict" (its model)
    note: str  # in words: "the median of the log's 12 single-token steps of the target"

    @classmethod
    def from_steps(cls, durations: Sequence[int]) -> Price | None:
        """The median of the target's single-token steps, or None where it had none."""
        if not durations:
            return None
        n = len(durations)
        med = float(statistics.median(durations))
        return cls(
            med,
            "log",
            f"priced at {med / 1e6:,.2f} ms a token: the median of the log's {n:,} single-token "
            f"step{'s' * (n != 1)} of the target",
        )

    @classmethod
    def from_model(cls, ns: float, how: str) -> Price:
        return cls(
            float(ns),
            "predict",
            f"priced at {ns / 1e6:,.2f} ms a token by predict's model ({how}): the log has no "
            "single-token step of the target",
        )


@dataclass
class SpecTotals:
    """Verifies summed: one request's, or a session's."""

    id: str = ""
    type: str = ""
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    produced: int = 0  # tokens the verifies gave: the accepted ones and one of the target's each
    draft_ns: int = 0
    verify_ns: int = 0
    rejected_ns: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)  # verifies with a token at position i
    accepted_by_pos: list[int] = field(default_factory=list)  # ... where it was accepted
    price: Price | None = None

    def add(self, v: Verify) -> None:
        self.type = self.type or v.type
        self.verify_steps += 1
        self.drafted += v.drafted
        self.accepted += v.accepted
        self.produced += v.produced
        self.draft_ns += v.draft_ns
        self.verify_ns += v.verify_ns
        self.rejected_ns += v.rejected_ns
        if len(self.drafted_by_pos) < v.drafted:
            grow = v.drafted - len(self.drafted_by_pos)
            self.drafted_by_pos += [0] * grow
            self.accepted_by_pos += [0] * grow
        for i in range(v.drafted):
            self.drafted_by_pos[i] += 1
            self.accepted_by_pos[i] += int(i < v.accepted)

    @property
    def spent_ns(self) -> int:
        """What the speculative tokens took: drafting and verifying them."""
        return self.draft_ns + self.verify_ns

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def acceptance_by_pos(self) -> list[float]:
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_by_pos, self.drafted_by_pos, strict=True)
        ]

    @property
    def plain_ns(self) -> float | None:
        """What a plain decode of the same tokens would have taken (None: no price)."""
        return None if self.price is None else self.produced * self.price.ns

    @property
    def saved_ns(self) -> float | None:
        """Time speculation saved against a plain decode (negative: what it cost)."""
        plain = self.plain_ns
        return None if plain is None else plain - self.spent_ns

    def verdict(self) -> str:
        """ "speculation saved 120 ms (31 % of a plain decode's 390 ms)", "speculation cost
        1,130 ms (57 % more than a plain decode's 1,980 ms)"; "" with no price or no verify."""
        saved, plain = self.saved_ns, self.plain_ns
        if saved is None or plain is None or not self.verify_steps:
            return ""
        pct = 100 * abs(saved) / plain if plain > 0 else 0.0
        what, than = ("saved", "of") if saved >= 0 else ("cost", "more than")
        return (
            f"speculation {what} {abs(saved) / 1e6:,.0f} ms ({pct:,.0f} % {than} a plain "
            f"decode's {plain / 1e6:,.0f} ms)"
        )

    def row(self) -> dict[str, Any]:
        saved, plain = self.saved_ns, self.plain_ns
        return {
            "id": self.id,
            "type": self.type,
            "verify_steps": self.verify_steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "tokens_from_verifies": self.produced,
            "draft_ms": self.draft_ns / 1e6,
            "verify_ms": self.verify_ns / 1e6,
            "rejected_ms": self.rejected_ns / 1e6,
            "acceptance_by_pos": self.acceptance_by_pos(),
            "drafted_by_pos": list(self.drafted_by_pos),
            "accepted_by_pos": list(self.accepted_by_pos),
            "plain_ms": None if plain is None else plain / 1e6,
            "saved_ms": None if saved is None else saved / 1e6,
            "verdict": self.verdict(),
            "priced_by": None if self.price is None else self.price.source,
            "price_note": None if self.price is None else self.price.note,
        }


def by_request(verifies: Iterable[Verify], price: Price | None) -> list[SpecTotals]:
    """Each request's verifies summed, in the order of their first verify."""
    out: dict[str, SpecTotals] = {}
    for v in verifies:
        t = out.get(v.request)
        if t is None:
            t = out[v.request] = SpecTotals(id=v.request, price=price)
        t.add(v)
    return list(out.values())


def session_totals(verifies: Iterable[Verify], price: Price | None) -> SpecTotals:
    t = SpecTotals(id="session", price=price)
    for v in verifies:
        t.add(v)
    return t


def draft_steps(verifies: Iterable[Verify]) -> set[int]:
    """The draft's steps the verifies name: those that drafted (and those that took a verified
    batch in)."""
    out: set[int] = set()
    for v in verifies:
        if v.draft_first >= 0:
            out.update(range(v.draft_first, v.draft_last + 1))
        if v.catchup_step >= 0:
            out.add(v.catchup_step)
    return out


def verify_tokens(verifies: Iterable[Verify]) -> dict[int, int]:
    """Per target step that verified drafts: the tokens it gave (over every slot it verified)."""
    out: dict[int, int] = {}
    for v in verifies:
        if v.step >= 0:
            out[v.step] = out.get(v.step, 0) + v.produced
    return out
