"""``instr follow``: watch a session log while it is being written, or serve its figures to
Prometheus (``--prometheus``)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("follow")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for LOG to appear.",
)
@click.option(
    "--prometheus",
    metavar="HOST:PORT",
    help="Serve LOG's figures at http://HOST:PORT/metrics instead, e.g. 127.0.0.1:9400 "
    "(:9400: every interface).",
)
def command(log: Path, wait: float, prometheus: str | None) -> None:
    """Follow a session LOG while another process writes it (instr run, instr serve, or your own
    program with a session open): a refreshing view of tokens/s, step-time percentiles, time per
    layer, top ops, KV cells used and memory. When stdout is not a terminal, one plain line per
    step instead. Exits 0 when the session ends, and on Ctrl-C.

    With --prometheus HOST:PORT, serve LOG's figures at /metrics in Prometheus' text format
    instead (a rotated series included: LOG.1, LOG.2... are read first), from a process of its own:
    a scrape never touches the program that writes the log. Histograms: time to first token,
    inter-token latency, end-to-end latency, queue, prefill, decode and inference time, prompt and
    generated tokens per request (from llama-server's or instr serve's request records), tokens
    and time per decode step by kind, sampling time per token by sampler (the pin's sampler
    names; recorded at --level detailed). Counters: requests by outcome, tokens, prompt-cache hits and
    queries. Gauges: busy slots, KV cells used and allocated, the prompt-cache reuse ratio, memory
    per buffer. Names and buckets are vLLM's (prefix llamacpp_instr: for vllm:) where vLLM has the
    metric:

        instr follow server.log --prometheus 127.0.0.1:9400

    `instr exec --metrics HOST:PORT` and `instr serve --metrics HOST:PORT` start it beside the
    program. Runs until Ctrl-C or SIGTERM; a port in use is an error (exit 2).
    docs/grafana-dashboard.json is a Grafana dashboard of these metrics."""
    if prometheus is not None:
        _serve(log, prometheus, wait)
        return
    from llamacpp_instr.converters.reports.renderers.live import follow

    try:
        status = follow(log, wait)
    except KeyboardInterrupt:
        return
    click.echo(f"session ended: status {status}", err=True)


def _serve(log: Path, listen: str, wait: float) -> None:
    """--prometheus: serve LOG's figures at ``listen`` (HOST:PORT)."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.running import exporter_launch as launch

    if wait == 0 and not log.exists():
        raise UserError(f"log file not found: {log}")
    sock = launch.bind(listen)
    click.echo(f"instr follow: {launch.url(sock)} serving {log}", err=True)
    launch.serve(log, sock, wait)
