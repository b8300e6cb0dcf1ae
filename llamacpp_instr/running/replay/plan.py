"""The requests a replay sends, from a recorded session's: only those of the endpoints it knows,
each with its recorded body (re-encoded JSON, bounded by the reader), at its recorded offset from
the first, divided by the speed; and why each other one is not sent.

A log is foreign bytes: nothing but the endpoints of ``ENDPOINTS`` is sent, every body is JSON the
reader checked and re-encoded, and a replay longer than ``SPAN_MAX_S`` at its speed is refused."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from llamacpp_instr.contract.errors import UserError

from .media import MediaFolder, markers

# llama-server's endpoints a replay sends (its completion and embedding routes)
COMPLETIONS = frozenset(
    {
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/infill",
    }
)
ENDPOINTS = COMPLETIONS | frozenset(
    {
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
    }
)
# the longest a replay may take at its speed (s): a forged log's times years apart end in one line
SPAN_MAX_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class ToSend:
    """A request to send: its place among the recorded ones, its endpoint, when to send it (ns
    from the replay's start), whether it streams, its body (compact JSON, media as markers)."""

    index: int
    endpoint: str
    at_ns: int
    stream: bool
    body: bytes
    media: int  # the markers its body holds


@dataclass
class Plan:
    """What a replay sends (``sends``, by time) and, for each, its recorded request
    (``recorded[i]`` is ``sends[i]``'s); ``skipped``: the others, counted by why."""

    sends: list[ToSend] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def _no_bodies(log: str, n: int, why: Counter[str]) -> UserError:
    told = ", ".join(f"{k}: {v}" for k, v in sorted(why.items()))
    return UserError(
        f"{log}: its {n} request record{'s' if n != 1 else ''} "
        f"{'were' if n != 1 else 'was'} recorded without bodies ({told}): record at detailed "
        "(instr exec's default) with a build that keeps each request's body"
    )


def _why_not(rec: dict[str, Any], body: Any, folder: MediaFolder) -> str | None:
    """Why a recorded request with a body is not sent, or None."""
    endpoint = rec.get("endpoint")
    if endpoint not in ENDPOINTS:
        return f"endpoint {str(endpoint)[:40]}"
    if (rec.get("method") or "POST") != "POST":
        return f"method {str(rec.get('method'))[:10]}"
    if type(body) is not dict:
        return "body not an object"
    if next(markers(body), None) is not None and folder.resolve(body) is None:
        return "media not at hand (--media DIR)"
    return None


def make_plan(log: str, recorded: list[dict[str, Any]], speed: float, folder: MediaFolder) -> Plan:
    """The plan of a replay of ``recorded`` (by arrival) at ``speed``; a one-line error when no
    request has a body, or when the replay would take longer than SPAN_MAX_S."""
    plan = Plan()
    no_body: Counter[str] = Counter()
    for rec in recorded:
        text = rec.get("body")
        if text is None:
            why = rec.get("body_left_out") or "none recorded"
            no_body[why] += 1
            plan.skipped[f"no body ({why})"] += 1
            continue
        body = orjson.loads(text)
        why_not = _why_not(rec, body, folder)
        if why_not is not None:
            plan.skipped[why_not] += 1
            continue
        plan.recorded.append(rec)
        plan.sends.append(
            ToSend(
                index=len(plan.sends),
                endpoint=rec["endpoint"],
                at_ns=rec["t_arrive"],
                stream=body.get("stream") is True,
                body=text,
                media=sum(1 for _ in markers(body)),
            )
        )
    if recorded and sum(no_body.values()) == len(recorded):
        raise _no_bodies(log, len(recorded), no_body)
    if plan.sends:
        t0 = plan.sends[0].at_ns
        span_s = (plan.sends[-1].at_ns - t0) / 1e9 / speed
        if span_s > SPAN_MAX_S:
            raise UserError(
                f"{log}: its requests span {span_s / 86400:,.0f} days at speed {speed:g}: "
                "replay part of it (--first N, --window START:END) or faster (--speed X)"
            )
        plan.sends = [
            ToSend(s.index, s.endpoint, int((s.at_ns - t0) / speed), s.stream, s.body, s.media)
            for s in plan.sends
        ]
    return plan
