"""Which request of a replay's log is which of its recording's: the pairs ``instr compare
RECORDED.log REPLAYED.log`` sets side by side with the replay's own figures (``replay_figures``).

A replay sends each request with a W3C ``traceparent`` of its own (``traceparent``: the replay's
run and the request's place in it), which the replay's log keeps in the request's record; the
responses file beside that log (``NEW.log.responses.jsonl``, written by ``instr replay``) names the
recorded request each place was and holds what its client measured. A pair is made only where the
two records' endpoints and bodies are the same (the replay sends the recorded body, and the server
records it again alike): by the responses file's id where it has one, else the first recorded
request, in arrival order, with that body and not paired yet. Two logs that are not a recording and its replay say so
in one line (``Matched.why``)."""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .replay_figures import Replayed

# a replay's traceparent: the run (16 hex digits) and the place + 1 (16), then the place + 1 again
_TRACE = re.compile(r"^00-([0-9a-f]{16})([0-9a-f]{16})-([0-9a-f]{16})-01$")
# the lines of a responses file read, at most (a replay sends at most this many requests)
RESPONSES_MAX = 100_000
LINE_MAX = 2 << 20  # (a line keeps at most 1 MiB of text, and its gaps)


def traceparent(run: int, index: int) -> str:
    """The W3C ``traceparent`` a replayed request carries (its record in the replay's log keeps it):
    the replay's ``run`` and the request's index make its trace id, neither id zero."""
    run_id = (run & ((1 << 64) - 1)).to_bytes(8, "big").hex()
    span = (index + 1).to_bytes(8, "big").hex()
    return f"00-{run_id}{span}-{span}-01"


def replay_place(tp: Any) -> tuple[int, int] | None:
    """The run and the place of a replay's ``traceparent`` (None: not one a replay sends)."""
    m = _TRACE.match(tp) if isinstance(tp, str) else None
    if m is None or m.group(2) != m.group(3) or int(m.group(3), 16) == 0:
        return None
    return int(m.group(1), 16), int(m.group(3), 16) - 1


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


def _ns(v: Any) -> int | None:
    ms = _num(v)
    return None if ms is None else int(round(ms * 1e6))


def response(line: dict[str, Any], tp: str) -> Replayed | None:
    """What a responses file's line says the client measured of the request sent with ``tp``;
    None for a line whose fields are not what ``instr replay`` writes."""
    index, status, itl = line.get("index"), line.get("status"), line.get("itl_ms")
    if type(index) is not int or type(status) is not int or type(itl) is not list:
        return None
    if not all(type(g) in (int, float) for g in itl):
        return None
    n_out, timings, error = line.get("n_out"), line.get("timings"), line.get("error")
    ttft = _ns(line.get("ttft_ms"))
    return Replayed(
        index,
        tp,
        status=status,
        error=error if type(error) is str else None,
        sent_ns=_ns(line.get("sent_ms")) or 0,
        e2e_ns=_ns(line.get("e2e_ms")),
        ttft_ns=ttft,
        gaps_ns=array("q", (int(round(g * 1e6)) for g in itl)),
        chunks=len(itl) + 1 if ttft is not None else 0,
        n_out=n_out if type(n_out) is int else None,
        timings=timings if type(timings) is dict else None,
    )


def read_responses(path: Path) -> dict[int, dict[str, Any]] | None:
    """A responses file's lines by their place (their ``text`` left out), at most RESPONSES_MAX;
    None when there is no such file. A line that is not a JSON object is passed over."""
    try:
        f = open(path, "rb")
    except OSError:
        return None
    out: dict[int, dict[str, Any]] = {}
    with f:
        for raw in f:
            if len(out) >= RESPONSES_MAX:
                break
            if len(raw) > LINE_MAX:
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if type(line) is dict and type(line.get("index")) is int:
                line.pop("text", None)
                out[line["index"]] = line
    return out


@dataclass
class Matched:
    """The pairs (a recorded request's record, its replay's record, the responses file's line for
    it or None), by place in the replay; how many of the replay's requests found none; and why
    none could be matched at all (one line), or None."""

    pairs: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]] = field(
        default_factory=list
    )
    replayed: int = 0  # the replay's requests (those carrying a replay's traceparent)
    unmatched: int = 0
    why: str | None = None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("body") is not None and (a.get("endpoint"), a.get("body")) == (
        b.get("endpoint"),
        b.get("body"),
    )


def _places(records: Iterable[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """The records a replay sent, by their place in it."""
    placed = [(p, r) for r in records if (p := replay_place(r.get("traceparent"))) is not None]
    return [(index, r) for (_, index), r in sorted(placed, key=lambda x: (x[0][1], x[0][0]))]


def match(
    recorded: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    responses: dict[int, dict[str, Any]] | None,
    names: tuple[str, str] = ("A", "B"),
) -> Matched:
    """The replay's requests (``replayed``: a log's records) paired with ``recorded`` (a log's
    records, by arrival) where their bodies are the same; ``responses``: the responses file beside
    the replay's log, by place (None: none); ``names``: the two logs' names in the one line."""
    a, b = names
    sent = _places(replayed)
    out = Matched(replayed=len(sent))
    if not sent:
        out.why = (
            f"{a} is a replay (its requests carry instr replay's traceparent) and {b} is not: "
            f"give the recording first, then its replay"
            if _places(recorded)
            else f"{b} is not a replay of {a}: none of its requests carries instr replay's "
            "traceparent"
        )
        return out
    if not any(r.get("body") is not None for r in recorded):
        out.why = f"{a} recorded no request bodies: a replay's requests are matched by them"
        out.unmatched = len(sent)
        return out
    by_id = {str(r.get("id")): k for k, r in enumerate(recorded)}
    by_body: dict[tuple[Any, Any], list[int]] = {}
    for j in range(len(recorded) - 1, -1, -1):  # (each list's first in arrival order at its end)
        by_body.setdefault((recorded[j].get("endpoint"), recorded[j].get("body")), []).append(j)
    used = [False] * len(recorded)
    for index, rec in sent:
        line = (responses or {}).get(index)
        k = by_id.get(str(line.get("id"))) if line is not None else None
        if k is None or used[k] or not _same(recorded[k], rec):
            same = by_body.get((rec.get("endpoint"), rec.get("body"))) or []
            while same and used[same[-1]]:
                same.pop()
            if not same or rec.get("body") is None:
                out.unmatched += 1
                continue
            k = same.pop()
        used[k] = True
        out.pairs.append((recorded[k], rec, line))
    if not out.pairs:
        out.why = (
            f"{b} is not a replay of {a}: none of its {len(sent):,} replayed requests has the "
            f"body of one of {a}'s"
        )
    return out
