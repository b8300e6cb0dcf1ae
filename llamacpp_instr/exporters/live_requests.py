"""Figures of a live session log, per step and per request, derived from its records as they come.

Every figure is one the log holds or follows from it:

* a step (``step_begin`` + ``step_end``): its kind, ``llama_decode`` time, tokens, KV cells used;
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
a log written without requests).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from .log_input import MALFORMED, slot_window, step_seqs

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


@dataclass(frozen=True)
class StepFigures:
    kind: str  # prompt or gen, as step_begin says
    dur_s: float
    n_tokens: int
    kv_used: int | None  # step_end.kv_used (sequence 0's span), when known
    running: int  # sequences with a request in flight (steps since their last request's end)


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
    running: int


def outcome_of(rec: dict[str, Any]) -> str:
    """The record's ``outcome``; in logs from before it was written, ``ok`` below status 400."""
    out = rec.get("outcome")
    if isinstance(out, str):
        return out
    return "ok" if int(rec.get("status") or 0) < 400 else "error"


def _ns(v: Any) -> int | None:
    return None if v is None else int(v)


class _SeqSteps:
    """One sequence's steps since its last request ended: start, end (ns) and the first position
    the step decoded for it. Arrays of int64, 24 bytes a step."""

    def __init__(self) -> None:
        self.start = array("q")
        self.end = array("q")
        self.pos0 = array("q")

    def add(self, start: int, end: int, pos0: int, cap: int) -> None:
        if len(self.start) >= cap:  # no record came for a long time: keep the newest half
            half = cap // 2
            del self.start[:half], self.end[:half], self.pos0[:half]
        self.start.append(start)
        self.end.append(end)
        self.pos0.append(pos0)

    def take(self, t0: int, t1: int) -> list[tuple[int, int, int]]:
        """The steps that began from ``t0`` to ``t1``; every step up to ``t1`` is forgotten (the
        next request of the sequence begins after it)."""
        mine = [
            (s, e, p)
            for s, e, p in zip(self.start, self.end, self.pos0, strict=True)
            if t0 <= s <= t1
        ]
        keep = [i for i, s in enumerate(self.start) if s > t1]
        if len(keep) < len(self.start):
            self.start = array("q", (self.start[i] for i in keep))
            self.end = array("q", (self.end[i] for i in keep))
            self.pos0 = array("q", (self.pos0[i] for i in keep))
        return mine

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class RequestTracker:
    """Feed it every record of a log (``add``); it returns the figures each record completes."""

    cap: int = 4096  # steps kept per sequence (raised to 2 * n_ctx by a session_start)
    seqs: dict[int, _SeqSteps] = field(default_factory=dict)
    # (sid, ctx) -> (kind, [(seq, n_tokens, first pos, last pos)]) of the step in flight
    _begun: dict[tuple[str, int], tuple[str, list[tuple[int, int, int, int]]]] = field(
        default_factory=dict
    )
    _sids: set[str] = field(default_factory=set)

    def add(self, rec: dict[str, Any]) -> SessionFigures | StepFigures | RequestFigures | None:
        """The figures ``rec`` completes, if any; a record without the schema's shape is skipped,
        as the converters skip it."""
        try:
            t = rec.get("type")
            if t == "step_begin":
                self._step_begin(rec)
            elif t == "step_end":
                return self._step_end(rec)
            elif t == "request":
                return self._request(rec)
            elif t == "session_start":
                return self._session(rec)
        except MALFORMED:
            pass
        return None

    def running(self) -> int:
        return sum(1 for s in self.seqs.values() if len(s))

    def state_size(self) -> int:
        """Steps and steps in flight held: what memory this tracker's state grows with."""
        return sum(len(s) for s in self.seqs.values()) + len(self._begun)

    def _session(self, rec: dict[str, Any]) -> SessionFigures:
        sid = str(rec["sid"])
        continued = sid in self._sids or isinstance(rec.get("file"), dict)
        if not continued:
            # a new run: the requests in flight in an earlier session will never end
            self.seqs.clear()
            self._begun.clear()
            self._sids = {sid}
        ctx = rec.get("context") or {}
        n_ctx = _ns(ctx.get("n_ctx"))
        if n_ctx:
            self.cap = max(2 * n_ctx, 4096)
        memory = []
        for b in (rec.get("memory") or {}).get("buffers") or []:
            if isinstance(b, dict):
                for kind in ("weights", "kv_cache", "compute"):
                    if isinstance(b.get(kind), int):
                        memory.append((str(b.get("buffer", "")), kind, int(b[kind])))
        model = rec.get("model") or {}
        meta = rec.get("metadata") or {}
        return SessionFigures(
            sid=sid,
            level=str(rec.get("level", "")),
            model=str(model.get("name") or model.get("architecture") or ""),
            program=str(meta.get("program") or meta.get("tool") or ""),
            n_ctx=n_ctx,
            n_seq_max=_ns(ctx.get("n_seq_max")),
            memory=memory,
            continued=continued,
        )

    def _step_begin(self, rec: dict[str, Any]) -> None:
        seqs = step_seqs(rec)
        if not seqs:  # a step without seqs holds sequence 0 only, at ``pos``
            pos = rec.get("pos") or [0, 0]
            seqs = [(0, int(rec["n_tokens"]), int(pos[0]), int(pos[1]))]
        self._begun[(str(rec["sid"]), int(rec["ctx"]))] = (str(rec["kind"]), seqs)

    def _step_end(self, rec: dict[str, Any]) -> StepFigures | None:
        begun = self._begun.pop((str(rec["sid"]), int(rec["ctx"])), None)
        if begun is None:
            return None  # its step_begin was not read (the exporter began after it)
        kind, seqs = begun
        start, dur = int(rec["t_start"]), int(rec["dur"])
        for q, _, p0, _ in seqs:
            self.seqs.setdefault(q, _SeqSteps()).add(start, start + dur, p0, self.cap)
        kv = rec.get("kv_used")
        return StepFigures(
            kind=kind,
            dur_s=dur * NS,
            n_tokens=int(rec["n_tokens"]),
            kv_used=int(kv) if isinstance(kv, int) and kv >= 0 else None,
            running=self.running(),
        )

    def _request(self, rec: dict[str, Any]) -> RequestFigures:
        wait, ttft, model, dur = (_ns(rec.get(k)) for k in ("wait", "ttft", "model", "dur"))
        t_arrive = int(rec["t_arrive"])
        itl: list[float] = []
        cached = None
        if wait is not None:  # it reached the model: the steps of its slot's sequence
            q = int(rec.get("slot") or 0)  # no slot: a server with one sequence (instr serve)
            steps = self.seqs.get(q)
            mine = steps.take(*slot_window(rec)) if steps is not None else []
            if mine:
                mine.sort()
                cached = mine[0][2]
            if ttft is not None:
                last = t_arrive + ttft
                for _, end, _ in mine:
                    if end > last:
                        itl.append((end - last) * NS)
                        last = end
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
            prompt_tokens=int(rec.get("prompt_tokens") or 0),
            gen_tokens=int(rec.get("gen_tokens") or 0),
            itl_s=itl,
            cached_tokens=cached,
            running=self.running(),
        )
