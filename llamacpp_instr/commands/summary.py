"""``instr summary``: the terminal view of a session log."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.commands import session_option


@click.command("summary")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--by",
    "by",
    type=click.Choice(["op", "layer", "node"]),
    default="op",
    show_default=True,
    help="Group op time by op type, layer or graph node.",
)
@click.option("--top", type=int, default=15, show_default=True, help="Rows to show (0 = all).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "csv", "json"]),
    default="text",
    show_default=True,
)
@session_option
def command(log: Path, by: str, top: int, fmt: str, sid: str | None) -> None:
    """Summarize a session LOG: tokens/s for prompt and generation, step-time percentiles, op-time
    coverage, and time per op type, layer or node (count, total, mean, p50, p95, share, achieved
    GFLOP/s and GB/s)."""
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.summary import render

    frames = load_session(log, sid)
    if frames.report.summary():
        click.echo(frames.report.summary(), err=True)
    click.echo(render(frames, by, top or None, fmt))
