"""A session log's requests sent to an OpenTelemetry collector (``instr export --otlp``): the log
read, or followed as it is written, each request's spans built (``otlp.SpanBuilder``) and posted in
batches that never hold the reading back (``otlp.Sender``)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from llamacpp_instr.contract.errors import UserError

from ..reading.tail import follow_log
from .live_figures import RequestFigures, RequestTracker, SessionFigures
from .otlp import Sender, SpanBuilder, endpoint_url

BATCH = 512  # spans per post at most


@dataclass(frozen=True)
class OtlpExport:
    """The requests of ``log`` to send to the collector at ``endpoint`` (a URL without a path gets
    /v1/traces); ``follow``: read on as ``log`` is written (a rotated series included) until Ctrl-C
    or SIGTERM, waiting up to ``wait`` seconds for it to appear; ``layers``: a child span per layer
    under each step span."""

    log: Path
    endpoint: str
    follow: bool = False
    wait: float = 0.0
    layers: bool = False


@dataclass(frozen=True)
class OtlpSent:
    """What was sent where: requests read, spans sent and lost, the last error of a lost batch."""

    url: str
    requests: int
    sent: int
    lost: int
    last_error: str = ""

    def summary(self) -> str:
        why = f" ({self.last_error})" if self.lost and self.last_error else ""
        return (
            f"instr export: {self.requests} requests, {self.sent} spans sent to {self.url}, "
            f"{self.lost} lost{why}"
        )


def export(request: OtlpExport) -> OtlpSent:
    """Send the requests of ``request.log`` as traces; returns once the log has been read (or, with
    ``follow``, on Ctrl-C or SIGTERM) and what was queued is sent or lost."""
    url = endpoint_url(request.endpoint)
    if not (request.follow and request.wait) and not request.log.exists():
        raise UserError(f"log file not found: {request.log}")
    sender = Sender(url)
    tracker, builder = RequestTracker(layers=request.layers), SpanBuilder()
    pending: list[Span] = []
    requests = 0

    def flush() -> None:
        sender.send(pending[:])
        pending.clear()

    def at_end_of_file() -> bool:
        flush()  # what is read so far goes now, not when the next request comes
        return not request.follow

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for rec in follow_log(request.log, wait=request.wait, stop=at_end_of_file):
            fig = tracker.add(rec)
            if isinstance(fig, SessionFigures):
                builder.session(fig)
            elif isinstance(fig, RequestFigures):
                requests += 1
                pending.extend(builder.spans(fig))
                if len(pending) >= BATCH:
                    flush()
    except KeyboardInterrupt:
        pass
    flush()
    sender.close()
    return OtlpSent(url, requests, sender.sent, sender.lost, sender.last_error)
