"""``instr to-otlp``: a session log's requests as OpenTelemetry traces, over OTLP/HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import click

BATCH = 512  # spans per post at most


@click.command("to-otlp", hidden=True)
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--endpoint",
    required=True,
    metavar="URL",
    help="The collector's OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces "
    "(/v1/traces is added to a URL without a path).",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Follow LOG as it is written (a rotated series included) until Ctrl-C or SIGTERM.",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="With --follow: seconds to wait for LOG to appear.",
)
@click.option(
    "--layers",
    is_flag=True,
    help="A child span per layer under each step span, from the log's layer spans (any level; "
    "about 30 spans a step for a 30-layer model).",
)
def command(log: Path, endpoint: str, follow: bool, wait: float, layers: bool) -> None:
    """The old name of `instr export LOG --otlp URL`.

    Send the requests of a session LOG (llama-server's under `instr exec`, or `instr serve`'s)
    to an OpenTelemetry collector as traces: one span per request, from its arrival to the end of
    its response, with a child span per decode step its slot took part in. Attributes follow the
    GenAI semantic conventions (gen_ai.operation.name, gen_ai.request.model,
    gen_ai.usage.input_tokens, gen_ai.usage.output_tokens) and add the request's queue time, time
    to first token, slot and prompt-cache tokens; an error's span has status ERROR. With
    --layers, each step span has a child per layer (when the layer ran, on which step).

        instr export server.log --otlp http://127.0.0.1:4318
        instr export server.log --otlp http://collector:4318/v1/traces --follow

    A collector that is down never holds the log's reading back: a batch is retried, then lost
    and counted. The last line says how many spans were sent and lost; the exit status is 1 when
    some were lost.
    """
    import signal

    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.formats.live_figures import (
        RequestFigures,
        RequestTracker,
        SessionFigures,
    )
    from llamacpp_instr.converters.formats.otlp import Sender, SpanBuilder, endpoint_url
    from llamacpp_instr.converters.reading.tail import follow_log

    url = endpoint_url(endpoint)
    if not (follow and wait) and not log.exists():
        raise UserError(f"log file not found: {log}")
    sender = Sender(url)
    tracker, builder = RequestTracker(layers=layers), SpanBuilder()
    pending: list = []
    requests = 0

    def flush() -> None:
        sender.send(pending[:])
        pending.clear()

    def at_end_of_file() -> bool:
        flush()  # what is read so far goes now, not when the next request comes
        return not follow

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for rec in follow_log(log, wait=wait, stop=at_end_of_file):
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
    lost = sender.lost
    why = f" ({sender.last_error})" if lost and sender.last_error else ""
    click.echo(
        f"instr export: {requests} requests, {sender.sent} spans sent to {url}, {lost} lost{why}",
        err=True,
    )
    if lost:
        sys.exit(1)
