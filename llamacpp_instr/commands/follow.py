"""``instr follow``: watch a session log while it is being written."""

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
def command(log: Path, wait: float) -> None:
    """Follow a session LOG while another process writes it (instr run, instr serve, or your own
    program with a session open): a refreshing view of tokens/s, step-time percentiles, time per
    layer, top ops, KV cells used and memory. When stdout is not a terminal, one plain line per
    step instead. Exits 0 when the session ends, and on Ctrl-C."""
    from llamacpp_instr.converters.reports.renderers.live import follow

    try:
        status = follow(log, wait)
    except KeyboardInterrupt:
        return
    click.echo(f"session ended: status {status}", err=True)
