"""A session log's requests as OpenTelemetry traces over OTLP/HTTP (``instr export --otlp``).

One span per request (its arrival to its response's end), with a child per decode step its slot's
sequence took part in (``live_figures``), built with ``opentelemetry-proto``'s messages and sent
as protobuf (``POST .../v1/traces``). Attributes follow the GenAI semantic conventions where they
have a name for the figure (``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``...); the rest is under ``llamacpp_instr.``.

Trace context: a request record that carries an incoming W3C ``traceparent`` header (field
``traceparent``) puts its span in that trace, under that parent; otherwise its trace and span ids
are derived from the session and request ids, so that sending a log twice sends the same ids.

Timestamps: the log's clock is CLOCK_MONOTONIC; a span's are that plus the offset between
``session_start.wall_time`` and ``session_start.ts``.

Sending never blocks the follower: batches wait in a bounded queue for a thread that posts them,
retrying a failed post (a collector down) with backoff; a batch that still fails, or finds the
queue full, is lost and counted.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from llamacpp_instr.contract.version import __version__

from .live_figures import RequestFigures, SessionFigures, StepSpan
from .log_input import UserError

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def endpoint_url(text: str) -> str:
    """The URL to post traces to: ``text`` as given, or with ``/v1/traces`` added when it names
    no path (``http://collector:4318``, as OTEL_EXPORTER_OTLP_ENDPOINT does); UserError if it is
    not an http(s) URL."""
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UserError(
            f"--otlp/--endpoint wants an http(s) URL such as http://127.0.0.1:4318 (got {text!r})"
        )
    try:
        u.port  # noqa: B018 (a bad port raises)
    except ValueError:
        raise UserError(f"--otlp/--endpoint has a bad port: {text!r}") from None
    if u.path in ("", "/"):
        return urllib.parse.urlunsplit((u.scheme, u.netloc, "/v1/traces", u.query, ""))
    return text


def _id(n: int, *parts: str) -> bytes:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=n).digest()


def _attr(key: str, v: str | int | float | bool) -> KeyValue:
    if isinstance(v, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=v))
    if isinstance(v, int):
        return KeyValue(key=key, value=AnyValue(int_value=v))
    if isinstance(v, float):
        return KeyValue(key=key, value=AnyValue(double_value=v))
    return KeyValue(key=key, value=AnyValue(string_value=v))


def _operation(endpoint: str) -> str:
    """gen_ai.operation.name for an endpoint of llama-server or instr serve."""
    if "chat" in endpoint:
        return "chat"
    if "embed" in endpoint:
        return "embeddings"
    return "text_completion"


@dataclass
class SpanBuilder:
    """Spans of the requests of one log, given its sessions as they come."""

    model: str = ""
    sid: str = ""
    offset: int = 0  # unix ns - log ns

    def session(self, s: SessionFigures) -> None:
        self.model, self.sid = s.model or self.model, s.sid
        if s.wall_time:
            try:
                wall = datetime.fromisoformat(s.wall_time.replace("Z", "+00:00"))
            except ValueError:
                return
            # whole microseconds, as the log writes them, to the nanosecond
            us = int(wall.timestamp()) * 1_000_000 + wall.microsecond
            self.offset = us * 1000 - s.ts

    def spans(self, q: RequestFigures) -> list[Span]:
        """The request's server span, then each of its steps' spans with their layers'."""
        rec = q.record
        parent = b""
        m = _TRACEPARENT.match(str(rec.get("traceparent", "")))
        if m and int(m.group(1), 16) and int(m.group(2), 16):
            trace_id, parent = bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2))
        else:
            trace_id = _id(16, self.sid, q.id)
        span_id = _id(8, self.sid, q.id, "request")
        out = [self._request_span(q, trace_id, span_id, parent)]
        for st in q.steps:
            out += self._step_spans(q, st, trace_id, span_id)
        return out

    def _request_attrs(self, q: RequestFigures, op: str) -> list[KeyValue]:
        """The request span's attributes: the OpenTelemetry GenAI and HTTP names, then ours."""
        rec = q.record
        attrs = [
            _attr("gen_ai.operation.name", op),
            _attr("gen_ai.provider.name", "llama.cpp"),
            _attr("http.request.method", str(rec.get("method", "POST"))),
            _attr("url.path", str(rec.get("endpoint", ""))),
            _attr("http.response.status_code", int(rec.get("status") or 0)),
            _attr("llamacpp_instr.request.id", q.id),
            _attr("llamacpp_instr.outcome", q.outcome),
            _attr("llamacpp_instr.stream", bool(rec.get("stream"))),
            _attr("llamacpp_instr.prompt_tokens_decoded", q.prompt_tokens),
            _attr("gen_ai.usage.output_tokens", q.gen_tokens),
        ]
        if self.model:
            # the server's one model: what the request asked for, and what answered it
            attrs += [_attr("gen_ai.request.model", self.model)]
            attrs += [_attr("gen_ai.response.model", self.model)]
        if q.cached_tokens is not None:
            attrs += [_attr("gen_ai.usage.input_tokens", q.cached_tokens + q.prompt_tokens)]
            attrs += [_attr("llamacpp_instr.prompt_cache_tokens", q.cached_tokens)]
        if rec.get("slot") is not None:
            attrs += [_attr("llamacpp_instr.slot", int(rec["slot"]))]
        if q.cache_miss is not None:  # why the prompt cache reused less (instr requests)
            attrs += [_attr("llamacpp_instr.prompt_cache_miss", q.cache_miss)]
        for name, v in (
            ("queue", q.queue_s),
            ("time_to_first_token", q.ttft_s),
            ("prefill", q.prefill_s),
            ("decode", q.decode_s),
        ):
            if v is not None:
                attrs.append(_attr(f"llamacpp_instr.{name}_s", v))
        return attrs

    def _request_span(
        self, q: RequestFigures, trace_id: bytes, span_id: bytes, parent: bytes
    ) -> Span:
        rec = q.record
        t_arrive = int(rec["t_arrive"])
        end = t_arrive + int(rec.get("dur") or 0)
        op = _operation(str(rec.get("endpoint", "")))
        attrs = self._request_attrs(q, op)
        status = Status(code=Status.STATUS_CODE_UNSET)
        if q.outcome == "error":
            attrs.append(_attr("error.type", str(rec.get("status") or "error")))
            status = Status(code=Status.STATUS_CODE_ERROR, message=str(rec.get("error", "")))
        events = []
        if q.ttft_s is not None:
            t_first = t_arrive + int(rec["ttft"])
            events.append(Span.Event(time_unix_nano=self._unix(t_first), name="first_token"))
        return Span(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent,
            name=f"{op} {self.model}".strip(),
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=self._unix(t_arrive),
            end_time_unix_nano=self._unix(max(end, t_arrive)),
            attributes=attrs,
            events=events,
            status=status,
        )

    def _step_spans(
        self, q: RequestFigures, st: StepSpan, trace_id: bytes, request_id: bytes
    ) -> list[Span]:
        """One step of the request: its layers' spans, then its own."""
        step_id = _id(8, self.sid, q.id, "step", str(st.step))
        out = [
            Span(
                trace_id=trace_id,
                span_id=_id(8, self.sid, q.id, "layer", str(st.step), str(k)),
                parent_span_id=step_id,
                name=f"layer {layer}" if layer >= 0 else "outside layers",
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=self._unix(t0),
                end_time_unix_nano=self._unix(t1),
                attributes=[_attr("llamacpp_instr.layer", layer)],
            )
            for k, (layer, t0, t1) in enumerate(q.layers.get(st.step, []))
        ]
        out.append(
            Span(
                trace_id=trace_id,
                span_id=step_id,
                parent_span_id=request_id,
                name="llama_decode",
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=self._unix(st.start),
                end_time_unix_nano=self._unix(st.end),
                attributes=[
                    _attr("llamacpp_instr.step", st.step),
                    _attr("llamacpp_instr.step.tokens", st.tokens),
                    _attr("llamacpp_instr.step.first_pos", st.pos0),
                ],
            )
        )
        return out

    def _unix(self, t: int) -> int:
        """Unix ns, within a fixed64 (a log's clock and wall time are what the log says)."""
        return min(max(0, t + self.offset), 2**64 - 1)


def export_request(spans: list[Span]) -> bytes:
    """One OTLP/HTTP request body (protobuf) holding ``spans``."""
    resource = Resource(
        attributes=[
            _attr("service.name", "llama.cpp"),
            _attr("telemetry.sdk.name", "llamacpp-instr"),
        ]
    )
    scope = InstrumentationScope(name="llamacpp_instr", version=__version__)
    req = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource=resource, scope_spans=[ScopeSpans(scope=scope, spans=spans)])
        ]
    )
    return req.SerializeToString()


@dataclass
class Sender:
    """Posts batches of spans from a thread of its own; never blocks the caller."""

    url: str
    timeout: float = 5.0
    retries: int = 3  # tries after the first, 0.5 s, 1 s, 2 s apart
    queued: int = 64  # batches waiting at most
    sent: int = 0  # spans
    lost: int = 0  # spans
    last_error: str = ""
    _down: bool = False
    _q: queue.Queue[list[Span] | None] = field(init=False)
    _thread: threading.Thread = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._q = queue.Queue(self.queued)
        self._thread = threading.Thread(target=self._run, name="otlp-sender", daemon=True)
        self._thread.start()

    def send(self, spans: list[Span]) -> None:
        if not spans:
            return
        try:
            self._q.put_nowait(spans)
        except queue.Full:
            with self._lock:
                self.lost += len(spans)

    def close(self, timeout: float = 60.0) -> None:
        """Wait for the queued batches to be sent (or lost), at most ``timeout`` seconds; what is
        still queued then is lost."""
        t_end = time.monotonic() + timeout
        try:
            self._q.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(max(0.0, t_end - time.monotonic()))
        while True:
            try:
                spans = self._q.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self.lost += len(spans or [])

    def _run(self) -> None:
        while True:
            spans = self._q.get()
            if spans is None:
                return
            body = export_request(spans)
            ok = False
            # a collector that is down: one try a batch until one gets through, so that what
            # waits behind it is not held for every batch's retries
            for attempt in range(1 if self._down else self.retries + 1):
                if attempt:
                    time.sleep(0.5 * 2 ** (attempt - 1))
                ok = self._post(body)
                if ok:
                    break
            self._down = not ok
            with self._lock:
                if ok:
                    self.sent += len(spans)
                else:
                    self.lost += len(spans)

    def _post(self, body: bytes) -> bool:
        req = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/x-protobuf"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
                return 200 <= r.status < 300
        except urllib.error.HTTPError as exc:
            self.last_error = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            self.last_error = str(getattr(exc, "reason", exc))
        return False
