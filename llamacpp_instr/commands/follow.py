"""``instr follow``: watch a session log while it is being written."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import click


def follow(log: Path, wait: float, stop: threading.Event | None = None) -> str:
    """Show the live view (terminal) or one line per step (otherwise) until the session ends,
    ``stop`` is set or Ctrl-C. Returns the session's status."""
    from llamacpp_instr.converters.analysis.follow import LiveState
    from llamacpp_instr.converters.reading.tail import tail

    state = LiveState()
    records = tail(log, wait=wait, stop=stop.is_set if stop else None, to_session_end=True)
    if not sys.stdout.isatty():
        for rec in records:
            step = state.add(rec)
            if step is not None:
                click.echo(state.line(step))
        return state.status
    from rich.live import Live

    from llamacpp_instr.converters.reports.renderers.live import view

    last = 0.0
    with Live(view(state), refresh_per_second=4, transient=False) as live:
        for rec in records:
            state.add(rec)
            now = time.monotonic()
            if now - last > 0.25 or rec.get("type") == "session_end":
                live.update(view(state))
                last = now
    return state.status


@click.command("follow")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for LOG to appear.",
)
def command(log: Path, wait: float) -> None:
    """Follow a session LOG while another process writes it (instr run, instr serve, or your own
    program with a session open): a refreshing view of tokens/s, step-time percentiles, time per
    layer, top ops, KV cells used and memory. When stdout is not a terminal, one plain line per
    step instead. Exits 0 when the session ends, and on Ctrl-C."""
    try:
        status = follow(log, wait)
    except KeyboardInterrupt:
        return
    click.echo(f"session ended: status {status}", err=True)
