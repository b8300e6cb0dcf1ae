"""A replay's figures, defined once: per request, the recording's against the replay's (time to
first token, time per output token, end to end, prompt-cache reuse, whether it generated the same
tokens); per setting, their percentiles, throughput and goodput under an SLO.

The definitions are vLLM's (``benchmark_serving``): TPOT is ``(e2e - ttft) / (n_out - 1)`` over a
request's output tokens (0 for a request of one token, when an SLO is judged); ITL pools every gap
between two chunks of generated text of every stream; a request meets the SLO when it succeeded
and its TTFT and TPOT are each at most the SLO's; goodput is the share of the requests sent that
did. Percentiles interpolate linearly between the closest ranks (numpy's default). A replayed
request's TTFT is the client's for a stream (from sending to the first chunk of text) and the
server's own (its request record in the replay's log) otherwise."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError

RECORDED = "recorded"  # the recording's own row
PERCENTILES = (50, 90, 99)
# the figures each setting gives percentiles of, in ms
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class Slo:
    """A service-level objective: the most TTFT and TPOT a good request has (ms; None: any)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, row: dict[str, Any]) -> bool:
        """Whether a request (a row of ``*_row``) succeeded within both; one without a TTFT (not
        streamed, to a server that logs none) is judged as its client saw it: every token at its
        end (vLLM's TTFT of a response that does not stream)."""
        if not row["ok"]:
            return False
        ttft, tpot = row["ttft_ms"], row["tpot_ms"]
        if ttft is None:  # its first token came with the whole answer, the others with it
            ttft, tpot = row["e2e_ms"], 0.0 if tpot is None else tpot
        if tpot is None and row["n_out"] is not None and row["n_out"] <= 1:
            tpot = 0.0  # one token: no time per further token
        for limit, value in ((self.ttft_ms, ttft), (self.tpot_ms, tpot)):
            if limit is not None and (value is None or value > limit):
                return False
        return True

    def describe(self) -> str:
        parts = [f"{k} {v:g} ms" for k, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms)) if v]
        return " and ".join(parts)


def parse_slo(text: str) -> Slo:
    """``ttft=MS,tpot=MS`` (either or both) -> ``Slo``."""
    given: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, value = item.partition("=")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in ("ttft", "tpot") or not ms > 0 or key in given:
            raise UserError(f"--slo {text!r}: give ttft=MS,tpot=MS (either or both, in ms)")
        given[key] = ms
    if not given:
        raise UserError(f"--slo {text!r}: give ttft=MS,tpot=MS (either or both, in ms)")
    return Slo(given.get("ttft"), given.get("tpot"))


@dataclass
class Replayed:
    """What the client measured of one request it sent (times in ns)."""

    index: int  # its place in the replay
    traceparent: str  # the header it was sent with, which its record in the replay's log carries
    status: int = 0  # the HTTP status; 0: no response (the connection failed, or timed out)
    error: str | None = None
    sent_ns: int = 0  # when it was sent, from the replay's start
    e2e_ns: int | None = None  # from sending to the response's end
    ttft_ns: int | None = None  # streams: from sending to the first chunk of generated text
    gaps_ns: array[int] = field(default_factory=lambda: array("q"))  # streams: between them
    chunks: int = 0  # streams: the chunks of generated text
    n_out: int | None = None  # output tokens, as the server counted them
    timings: dict[str, Any] | None = None  # the server's `timings`

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def tpot_ns(e2e: float | None, ttft: float | None, n_out: int | None) -> float | None:
    """Time per output token after the first: ``(e2e - ttft) / (n_out - 1)``; None for a request
    of fewer than two tokens or without either time."""
    if e2e is None or ttft is None or n_out is None or n_out < 2:
        return None
    return (e2e - ttft) / (n_out - 1)


def output_tokens(rec: dict[str, Any]) -> int | None:
    """The tokens a request record's first task generated: its ``gen_ids`` (and those left out of
    them), else its ``gen_tokens`` and the last one sampled, which is never decoded (``gen_tokens``
    counts the tokens fed back), as the server's ``timings.predicted_n`` counts them."""
    ids = rec.get("gen_ids")
    if ids is not None:
        return len(ids) + (rec.get("gen_ids_left_out") or 0)
    n = rec.get("gen_tokens")
    return n + 1 if n is not None and rec.get("ttft") is not None else n


def _ok(rec: dict[str, Any]) -> bool:
    status = rec.get("status") or 0
    return (rec.get("outcome") or ("ok" if status < 400 else "error")) == "ok"


def _reused(rec: dict[str, Any] | None) -> int | None:
    cache = rec.get("cache") if rec is not None else None
    return cache.get("reused") if cache else None


def _base(setting: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "setting": setting,
        "id": rec.get("id"),
        "endpoint": rec.get("endpoint"),
        "stream": bool(rec.get("stream")),
        "recorded_ttft_ms": _ms(rec.get("ttft")),
        "recorded_e2e_ms": _ms(rec.get("dur")),
        "recorded_cache_reused": _reused(rec),
    }


def recorded_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The recording's figures of a request (its record in the recorded log)."""
    ttft, dur, n = rec.get("ttft"), rec.get("dur"), output_tokens(rec)
    return _base(RECORDED, rec) | {
        "status": rec.get("status"),
        "ok": _ok(rec),
        "n_out": n,
        "ttft_ms": _ms(ttft),
        "tpot_ms": _ms(tpot_ns(dur, ttft, n)),
        "e2e_ms": _ms(dur),
        "itl_max_ms": None,
        "server_ttft_ms": _ms(ttft),
        "server_dur_ms": _ms(dur),
        "prompt_ms": None,
        "predicted_ms": None,
        "cache_reused": _reused(rec),
        "cache_n": None,
        "identical": None,
    }


def identical(recorded: dict[str, Any], replayed: dict[str, Any] | None) -> bool | None:
    """Whether the replay generated the recording's tokens (``gen_ids``, all of them kept on both
    sides); None when either log lacks them."""
    if replayed is None:
        return None
    a, b = recorded.get("gen_ids"), replayed.get("gen_ids")
    if a is None or b is None:
        return None
    return bool(
        a == b and recorded.get("gen_ids_left_out", 0) == replayed.get("gen_ids_left_out", 0)
    )


def replayed_row(
    setting: str, rec: dict[str, Any], sent: Replayed, served: dict[str, Any] | None
) -> dict[str, Any]:
    """A replayed request's figures: the client's, the server's ``timings`` and, where the replay's
    log has its record (``served``), the server's own times, cache and tokens."""
    stream = bool(rec.get("stream"))
    server_ttft = served.get("ttft") if served else None
    ttft = sent.ttft_ns if stream else server_ttft
    n_out = sent.n_out if sent.n_out is not None else (output_tokens(served) if served else None)
    timings = sent.timings or {}
    return _base(setting, rec) | {
        "status": sent.status,
        "ok": sent.ok,
        "n_out": n_out,
        "ttft_ms": _ms(ttft),
        "tpot_ms": _ms(tpot_ns(sent.e2e_ns, ttft, n_out)),
        "e2e_ms": _ms(sent.e2e_ns),
        "itl_max_ms": _ms(max(sent.gaps_ns)) if sent.gaps_ns else None,
        "server_ttft_ms": _ms(server_ttft),
        "server_dur_ms": _ms(served.get("dur") if served else None),
        "prompt_ms": timings.get("prompt_ms"),
        "predicted_ms": timings.get("predicted_ms"),
        "cache_reused": _reused(served),
        "cache_n": timings.get("cache_n"),
        "identical": identical(rec, served),
    }


def percentiles(values: Iterable[float | None]) -> dict[str, float | None]:
    """p50, p90 and p99 of the values given (None left out); None each when there is none."""
    xs = np.fromiter((v for v in values if v is not None), dtype=float)
    if not len(xs):
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": float(np.percentile(xs, p)) for p in PERCENTILES}


@dataclass(frozen=True)
class Setting:
    """One row of the comparison: a setting's requests (rows of ``*_row``), the inter-token gaps
    of its streams, the wall span they took (ns) and its peak bytes per device."""

    name: str
    rows: Sequence[dict[str, Any]]
    gaps_ns: Sequence[array[int]] = ()
    span_ns: int = 0
    peaks: dict[str, int] = field(default_factory=dict)
    log: str | None = None


def summary(s: Setting, slo: Slo | None) -> dict[str, Any]:
    """A setting's percentiles of each latency (its successful requests'), throughput (output
    tokens of its successful requests over the wall span) and goodput under ``slo``."""
    ok = [r for r in s.rows if r["ok"]]
    out: dict[str, Any] = {
        "setting": s.name,
        "log": s.log,
        "requests": len(s.rows),
        "failed": len(s.rows) - len(ok),
    }
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        out[key] = percentiles(r[key] for r in ok)
    out["itl_ms"] = percentiles(g / 1e6 for gaps in s.gaps_ns for g in gaps)
    tokens = sum(r["n_out"] or 0 for r in ok)
    out["output_tokens"] = tokens
    out["span_s"] = s.span_ns / 1e9
    out["throughput"] = tokens / (s.span_ns / 1e9) if s.span_ns > 0 else None
    out["goodput"] = (
        sum(slo.met(r) for r in s.rows) / len(s.rows) if slo is not None and s.rows else None
    )
    out["peak_memory"] = dict(s.peaks)
    return out


def recorded_span(records: Sequence[dict[str, Any]]) -> int:
    """The recording's wall span (ns): from the first arrival to the last response's end."""
    if not records:
        return 0
    start = min(r["t_arrive"] for r in records)
    return max(r["t_arrive"] + (r.get("dur") or 0) for r in records) - start


def replayed_span(sent: Sequence[Replayed]) -> int:
    """A replay's wall span (ns): from the first send to the last response's end."""
    if not sent:
        return 0
    start = min(x.sent_ns for x in sent)
    return max(x.sent_ns + (x.e2e_ns or 0) for x in sent) - start


def cdf(values: Sequence[float | None], grid: Sequence[float]) -> list[float]:
    """The share of ``values`` (None left out) at most each point of ``grid``."""
    xs = np.sort(np.fromiter((v for v in values if v is not None), dtype=float))
    if not len(xs):
        return [0.0 for _ in grid]
    return (np.searchsorted(xs, np.asarray(grid, dtype=float), side="right") / len(xs)).tolist()
