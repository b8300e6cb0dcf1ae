"""Figures of a live session log, per step and per request, derived from its records as they come.

Every figure is one the log holds or follows from it:

* a decode step (``step_begin`` + ``step_end``): its kind, ``llama_decode`` time, tokens, KV cells
  used; an encoder's encode (an image's or a sound's: ``reading.decode.media.is_encode``) is no
  sequence's step, and has figures of its own (``EncodeFigures``);
* the host's work after a step (a ``host`` record): the sampling time of each token sampled, in all
  and by sampler (``reading.decode.host.sampler_type``: names bounded to the pin's samplers);
* a request (a ``request`` record, written when the request is done): its outcome, queue time,
  time to first token, end-to-end time, time holding the model, prompt and generated tokens, and
  two figures the record alone does not say, from the steps that served it (the converters' rule,
  ``request_share``: the steps whose batch holds its slot's sequence, from ``t_arrive + wait`` to
  ``t_arrive + wait + model``):
  - the gaps between its tokens: from its first token (``t_arrive + ttft``) to the end of the
    first step after it, and so on, one per generated token decoded;
  - the prompt tokens its slot's cache held: the first position its first step decoded at (the
    server decodes a prompt from where the cached prefix ends).

Memory: a request's record comes after its steps, so the steps of each sequence are kept until
the record of the request that held it comes, and forgotten then: what the requests in flight
need, no more (at most ``max(2 * n_ctx, 4096)`` steps per sequence, in case no record comes:
a log written without requests). What is kept, and the steps in flight, are ``live_steps``'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..reading.decode.host import host_record, sampler_type
from .live_steps import RequestSteps, StepsInFlight, StepSpan, count
from .log_input import MALFORMED, VALUE_MAX, cache_reason, opt_count

NS = 1e-9


@dataclass(frozen=True)
class SessionFigures:
    """What a ``session_start`` says that the metrics show (every file of a rotated log repeats
    it; ``continued`` then)."""

    sid: str
    level: str
    model: str
    program: str
    n_ctx: int | None  # KV cells the context allocated (context.n_ctx)
    n_seq_max: int | None
    # (buffer type, weights|kv_cache|compute, bytes)
    memory: list[tuple[str, str, int]]
    continued: bool
    ts: int  # the record's ts (the log's clock) ...
    wall_time: str  # ... and the wall clock then (ISO-8601 UTC), "" if the log does not say


@dataclass(frozen=True)
class StepFigures:
    kind: str  # prompt or gen, as step_begin says
    dur_s: float
    n_tokens: int
    kv_used: int | None  # step_end.kv_used (sequence 0's span), when known
    running: int  # sequences with a request in flight (steps since their last request's end)


@dataclass(frozen=True)
class EncodeFigures:
    """An encoder's encode: its time until its embeddings were ready, and how many it made."""

    dur_s: float
    n_tokens: int


@dataclass(frozen=True)
class HostFigures:
    """A ``host`` record's sampling: each sequence's time per token sampled (``total``), and at
    DETAILED each sampler type's, with the tokens it stands for."""

    # (sampler type or "total", seconds per token, tokens)
    per_token: list[tuple[str, float, int]]


@dataclass(frozen=True)
class RequestFigures:
    id: str
    outcome: str  # ok, error or cancelled
    queue_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    inference_s: float | None  # holding the model (the record's ``model``)
    prefill_s: float | None  # from getting the model to the first token
    decode_s: float | None  # from the first token to letting the model go
    prompt_tokens: int
    gen_tokens: int
    itl_s: list[float]  # the gaps between its tokens
    cached_tokens: int | None  # prompt tokens its slot's cache held (not decoded again)
    # why its prompt reused less than a cache held (request_causes.MISS_REASONS; None: it reused
    # all it could, or the record has no ``cache`` object to say)
    cache_miss: str | None
    running: int
    steps: list[StepSpan]  # the steps that served it, in time order
    # with RequestTracker(layers=True): each of those steps' layer spans, (layer, start, end) in
    # the log's ns, from the compute records (every ubatch of the step)
    layers: dict[int, list[tuple[int, int, int]]]
    record: dict[str, Any]  # the request record itself


def outcome_of(rec: dict[str, Any]) -> str:
    """The record's ``outcome``; in logs from before it was written, ``ok`` below status 400."""
    out = rec.get("outcome")
    if isinstance(out, str):
        return out
    status = rec.get("status")
    return "ok" if type(status) is not int or status < 400 else "error"


def _ns(v: Any) -> int | None:
    """None, or a count or time (ns) the log may hold: an integer from 0 to below 2**62 (else
    ValueError or TypeError: the record is skipped). What the tracker takes from a record is read
    through here or ``live_steps.count``, so that no figure it makes overflows a metric or a
    span."""
    return opt_count(v)


def _opt(v: Any) -> int | None:
    """``_ns``, None for a value it refuses (a session's sizes: the session is still read)."""
    try:
        return opt_count(v)
    except (TypeError, ValueError):
        return None


# what ``RequestTracker.add`` returns: the figures a record completes
Figures = SessionFigures | StepFigures | EncodeFigures | RequestFigures | HostFigures


@dataclass
class RequestTracker:
    """Feed it every record of a log (``add``); it returns the figures each record completes."""

    cap: int = 4096  # steps kept per sequence (raised to 2 * n_ctx by a session_start)
    layers: bool = False  # keep the steps' layer spans (compute records) for RequestFigures.layers
    # the steps the requests in flight took part in, and their layer spans
    kept: RequestSteps = field(default_factory=RequestSteps)
    flight: StepsInFlight = field(default_factory=StepsInFlight)  # the steps begun, not ended
    _sids: set[str] = field(default_factory=set)

    def add(self, rec: dict[str, Any]) -> Figures | None:
        """The figures ``rec`` completes, if any; a record without the schema's shape is skipped,
        as the converters skip it."""
        try:
            t = rec.get("type")
            if t == "step_begin":
                self.flight.begin(rec)
            elif t == "step_end":
                return self._step_end(rec)
            elif t == "request":
                return self._request(rec)
            elif t == "host":
                return host_figures(rec)
            elif t == "compute":
                self.flight.ready_at(rec, count(rec["t_start"]) + count(rec["dur"]))
                if self.layers:
                    self.kept.add_layers(rec, self.cap)
            elif t == "transfers" and rec.get("phase") == "step":
                ends = [count(row[9]) for row in rec.get("rows") or []]
                if ends:
                    self.flight.ready_at(rec, count(rec["t_start"]) + max(ends))
            elif t == "session_start":
                return self._session(rec)
        except MALFORMED:
            pass
        return None

    def running(self) -> int:
        return self.kept.running()

    def state_size(self) -> int:
        """Steps and steps in flight held: what memory this tracker's state grows with."""
        return len(self.kept) + len(self.flight)

    def _session(self, rec: dict[str, Any]) -> SessionFigures:
        sid = str(rec["sid"])
        continued = sid in self._sids or isinstance(rec.get("file"), dict)
        if not continued:
            # a new run: the requests in flight in an earlier session will never end
            self.kept.clear()
            self.flight.clear()
            self._sids = {sid}
        ctx = rec.get("context") or {}
        ts = count(rec["ts"])
        n_ctx = _opt(ctx.get("n_ctx"))
        if n_ctx:
            self.cap = max(2 * n_ctx, 4096)
        memory = []
        for b in (rec.get("memory") or {}).get("buffers") or []:
            if isinstance(b, dict):
                for kind in ("weights", "kv_cache", "compute"):
                    if type(b.get(kind)) is int and 0 <= b[kind] < VALUE_MAX:
                        memory.append((str(b.get("buffer", "")), kind, int(b[kind])))
        model = rec.get("model") or {}
        meta = rec.get("metadata") or {}
        return SessionFigures(
            sid=sid,
            level=str(rec.get("level", "")),
            model=str(model.get("name") or model.get("architecture") or ""),
            program=str(meta.get("program") or meta.get("tool") or ""),
            n_ctx=n_ctx,
            n_seq_max=_opt(ctx.get("n_seq_max")),
            memory=memory,
            continued=continued,
            ts=ts,
            wall_time=str(rec.get("wall_time") or ""),
        )

    def _step_end(self, rec: dict[str, Any]) -> StepFigures | EncodeFigures | None:
        ended = self.flight.end(rec)
        if ended is None:
            return None
        kind, seqs, start, dur = ended
        self.kept.add(seqs, start, start + dur, count(rec["step"]), self.cap)
        if kind is None:
            return EncodeFigures(dur_s=dur * NS, n_tokens=count(rec["n_tokens"]))
        kv = rec.get("kv_used")
        return StepFigures(
            kind=kind,
            dur_s=dur * NS,
            n_tokens=count(rec["n_tokens"]),
            kv_used=kv if type(kv) is int and 0 <= kv < VALUE_MAX else None,
            running=self.running(),
        )

    def _request(self, rec: dict[str, Any]) -> RequestFigures:
        wait, ttft, model, dur = (_ns(rec.get(k)) for k in ("wait", "ttft", "model", "dur"))
        t_arrive = count(rec["t_arrive"])
        slot = _ns(rec.get("slot"))
        _ns(rec.get("status"))
        prompt_tokens, gen_tokens = _ns(rec.get("prompt_tokens")), _ns(rec.get("gen_tokens"))
        for k in ("id", "endpoint", "method", "outcome", "error", "traceparent"):
            if rec.get(k) is not None and type(rec[k]) is not str:
                raise TypeError(f"a request's {k} is not a string")
        itl: list[float] = []
        cached = None
        mine: list[StepSpan] = []
        if wait is not None:  # it reached the model: the steps of its slot's sequence
            q = slot or 0  # no slot: a server with one sequence (instr serve)
            t0 = t_arrive + wait
            t1 = t0 + model if model is not None else t_arrive + (dur or 0)
            mine = self.kept.take(q, t0, t1)
            if mine and mine[0].pos0 >= 0:
                cached = mine[0].pos0
            if ttft is not None:
                last = t_arrive + ttft
                for st in mine:
                    if st.end > last:
                        itl.append((st.end - last) * NS)
                        last = st.end
        prefill = ttft - wait if ttft is not None and wait is not None and ttft >= wait else None
        decode = None
        if ttft is not None and wait is not None and model is not None:
            decode = wait + model - ttft if wait + model >= ttft else None
        return RequestFigures(
            id=str(rec.get("id", "")),
            outcome=outcome_of(rec),
            queue_s=None if wait is None else wait * NS,
            ttft_s=None if ttft is None else ttft * NS,
            e2e_s=None if dur is None else dur * NS,
            inference_s=None if model is None else model * NS,
            prefill_s=None if prefill is None else prefill * NS,
            decode_s=None if decode is None else decode * NS,
            prompt_tokens=prompt_tokens or 0,
            gen_tokens=gen_tokens or 0,
            itl_s=itl,
            cached_tokens=cached,
            cache_miss=cache_reason(rec.get("cache"))[1],
            running=self.running(),
            steps=mine,
            layers=self.kept.layers_of(mine),
            record=rec,
        )


MAX_OBSERVED = 256  # tokens a record's row is observed for at most (a damaged log's count)


def host_figures(rec: dict[str, Any]) -> HostFigures | None:
    """A ``host`` record's sampling per token sampled: each sequence's in all, and by sampler type
    (its parts' time over the sequence's tokens); None when it sampled nothing."""
    h = host_record(rec)
    out: list[tuple[str, float, int]] = []
    if not h.seqs and h.sampled:  # MINIMAL: the record's totals
        out.append(("total", h.sample_ns / h.sampled * NS, min(h.sampled, MAX_OBSERVED)))
    for row, q in enumerate(h.seqs):
        if not q.sampled:
            continue
        n = min(q.sampled, MAX_OBSERVED)
        out.append(("total", q.sample_ns / q.sampled * NS, n))
        by_type: dict[str, int] = {}
        for p in h.parts:
            name = sampler_type(p.kind, p.name) if p.row == row else None
            if name is not None:
                by_type[name] = by_type.get(name, 0) + p.ns
        out += [(name, ns / q.sampled * NS, n) for name, ns in by_type.items()]
    return HostFigures(out) if out else None
