"""``instr metrics``: serve a live session log's figures to Prometheus."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import click


class _Stop(Exception):
    """SIGTERM: stop serving (exit 0)."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop


@click.command("metrics")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Where to serve /metrics, e.g. 127.0.0.1:9400 (:9400: every interface).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for LOG to appear.",
)
@click.option("--listen-fd", type=int, hidden=True, help="A listening socket inherited.")
@click.option("--after", type=click.IntRange(min=0), hidden=True, help="Begin at this byte.")
@click.option("--parent-pid", type=int, hidden=True, help="End when this process has ended.")
def command(
    log: Path,
    listen: str | None,
    wait: float,
    listen_fd: int | None,
    after: int | None,
    parent_pid: int | None,
) -> None:
    """Follow a session LOG as it is written (a rotated series included: LOG.1, LOG.2... are read
    first) and serve its figures at /metrics in Prometheus' text format, from a process of its own:
    a scrape never touches the program that writes the log.

    Histograms: time to first token, inter-token latency, end-to-end latency, queue, prefill,
    decode and inference time, prompt and generated tokens per request (from llama-server's or
    instr serve's request records), tokens and time per decode step by kind. Counters: requests by
    outcome, tokens, prompt-cache hits and queries. Gauges: busy slots, KV cells used and
    allocated, the prompt-cache reuse ratio, memory per buffer. Names and buckets are vLLM's
    (prefix llamacpp_instr: for vllm:) where vLLM has the metric:

        instr metrics server.log --listen 127.0.0.1:9400

    `instr exec --metrics HOST:PORT` and `instr serve --metrics HOST:PORT` start it beside the
    program. Runs until Ctrl-C or SIGTERM; a log that does not exist, or a port in use, is an
    error (exit 2). docs/grafana-dashboard.json is a Grafana dashboard of these metrics.
    """
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.formats.live_figures import RequestTracker
    from llamacpp_instr.converters.formats.prometheus import Metrics, serve_http
    from llamacpp_instr.converters.reading.tail import follow_log
    from llamacpp_instr.running import exporter_launch as launch

    if (listen is None) == (listen_fd is None):
        raise click.UsageError("--listen HOST:PORT is required")
    if parent_pid is not None:
        wait = float("inf")  # the program beside it creates the log when it opens its session
    if wait == 0 and not log.exists():
        raise UserError(f"log file not found: {log}")
    sock = launch.bind(listen) if listen is not None else socket.socket(fileno=listen_fd)
    metrics = Metrics()
    server = serve_http(sock, metrics.registry)
    if listen is not None:
        click.echo(f"instr metrics: {launch.url(sock)} serving {log}", err=True)
    stop = None
    if parent_pid is not None:
        os.nice(5)  # beside the program it measures: the program's CPU comes first

        def stop() -> bool:
            return os.getppid() != parent_pid

    signal.signal(signal.SIGTERM, _on_term)
    tracker = RequestTracker()
    try:
        for rec in follow_log(log, wait=wait, stop=stop, offset=after):
            metrics.observe(tracker.add(rec))
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        server.shutdown()
        sys.stderr.flush()
