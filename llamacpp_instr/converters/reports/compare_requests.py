"""``instr compare RECORDED.log REPLAYED.log``'s requests: a replay's requests against their
recording, as ``instr replay`` reports them (the same rows, percentiles, throughput, goodput and
CDFs: ``session.replay_figures``, laid out by ``replay_report``), from the two logs alone.

The pairs are ``session.replay_match``'s. The replayed side's times are its client's, from the
responses file beside its log (``REPLAYED.log.responses.jsonl``) where it is there, else its
server's own (each request's record: TTFT, end to end; no inter-token gaps). Two logs that are not
a recording and its replay get one line instead; two logs without requests, no section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

from ..session import replay_figures as figures
from ..session.replay_log import Served, read_replayed, read_served
from ..session.replay_match import Matched, match, read_responses, response
from .replay_report import cdf_chart, requests_table, settings_table
from .report import Fact, Section

TITLE = "Requests, recorded against replayed"
SERVER_TIMES = (
    "TTFT and end to end: the replay's server's own (its request records), there being no "
    "responses file beside its log"
)


class _Unread(Exception):
    """A log whose requests do not read (over a replay's bounds): its one line."""


def _read(path: Path, replay: bool) -> Served | None:
    """A log's requests (a replay's: those it sent), None for a log with none."""
    try:
        return read_replayed(path) if replay else read_served(path)
    except UserError as exc:
        if "no request records" in str(exc):
            return None
        raise _Unread(str(exc)) from None


def _from_record(rec: dict[str, Any], t0: int, tp: str) -> figures.Replayed:
    """A replayed request as its server recorded it (no client's figures at hand)."""
    status = rec.get("status")
    ok = (rec.get("outcome") or "ok") == "ok"
    return figures.Replayed(
        index=-1,
        traceparent=tp,
        status=status if type(status) is int and status else (200 if ok else 500),
        error=None if ok else str(rec.get("outcome")),
        sent_ns=int(rec["t_arrive"]) - t0,
        e2e_ns=rec.get("dur"),
        ttft_ns=rec.get("ttft"),
        n_out=figures.output_tokens(rec),
    )


def _settings(
    m: Matched, a: Served, b: Served, name: str
) -> tuple[figures.Setting, figures.Setting, bool]:
    """The recording's and the replay's figures of the pairs, and whether the replay's are its
    client's (a well-formed line of the responses file for every pair; else all its server's)."""
    heard = [
        response(line, str(rb.get("traceparent"))) if line is not None else None
        for _, rb, line in m.pairs
    ]
    client = all(x is not None for x in heard)  # (else each the server's, alike)
    t0 = min((int(rb["t_arrive"]) for _, rb, _ in m.pairs), default=0)
    sent = [
        x if client and x is not None else _from_record(rb, t0, str(rb.get("traceparent")))
        for (_, rb, _), x in zip(m.pairs, heard, strict=True)
    ]
    recorded = [ra for ra, _, _ in m.pairs]
    rows_a = [figures.recorded_row(r) for r in recorded]
    rows_b = [
        figures.replayed_row(name, ra, x, rb) for (ra, rb, _), x in zip(m.pairs, sent, strict=True)
    ]
    span_b = (
        figures.replayed_span(sent)
        if client
        else figures.recorded_span([rb for _, rb, _ in m.pairs])
    )
    return (
        figures.Setting(figures.RECORDED, rows_a, (), figures.recorded_span(recorded), a.peaks),
        figures.Setting(name, rows_b, [x.gaps_ns for x in sent], span_b, b.peaks),
        client,
    )


def requests_comparison(
    path_a: Path, path_b: Path, slo: figures.Slo | None = None
) -> dict[str, Any] | None:
    """B's replayed requests against A's, the recording: the pairs' rows and each side's summary
    (``replay_figures``), or one line saying why none compare (``why``); None when neither log
    holds requests."""
    try:
        a, b = _read(path_a, False), _read(path_b, True)
    except _Unread as exc:
        return {"why": str(exc)}
    if a is None and (b is None or not b.requests):
        return None
    names = (path_a.name, path_b.name)
    if a is None:
        return {"why": f"{names[0]} holds no request records: it is not a server's recording"}
    if b is None:
        return {"why": f"{names[1]} holds no request records: it is not a replay of {names[0]}"}
    m = match(a.requests, b.requests, read_responses(_responses_of(path_b)), names)
    if m.why is not None:
        return {"why": m.why}
    rec, rep, client = _settings(m, a, b, names[1])
    return {
        "why": None,
        "matched": len(m.pairs),
        "replayed": m.replayed,
        "unmatched": m.unmatched,
        "times": "client" if client else "server",
        "slo": None if slo is None else {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "settings": [figures.summary(s, slo) for s in (rec, rep)],
        "requests": list(rep.rows),
        "recorded_requests": list(rec.rows),
    }


def _responses_of(path: Path) -> Path:
    return path.with_name(path.name + ".responses.jsonl")


def section(d: dict[str, Any]) -> Section:
    """The section of ``requests_comparison``'s answer."""
    if d["why"] is not None:
        return Section(TITLE, text=d["why"])
    sides = [
        figures.Setting(figures.RECORDED, d["recorded_requests"]),
        figures.Setting(d["settings"][1]["setting"], d["requests"]),
    ]
    facts = [
        Fact("requests compared", f"{d['matched']:,} of the replay's {d['replayed']:,}"),
        Fact(
            "replayed times",
            (
                "its client's (the responses file beside its log)"
                if d["times"] == "client"
                else "its server's own (no responses file beside its log)"
            ),
        ),
    ]
    if d["unmatched"]:
        facts.append(
            Fact("not matched", f"{d['unmatched']:,} (their bodies are none of the recording's)")
        )
    charts = [c for k in ("e2e_ms", "ttft_ms") if (c := cdf_chart(sides, k)) is not None]
    return Section(
        TITLE,
        facts=facts,
        tables=[
            settings_table(d["settings"]),
            requests_table(d["requests"], None if d["times"] == "client" else SERVER_TIMES),
        ],
        charts=charts,
    )
