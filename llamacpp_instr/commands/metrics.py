"""``instr metrics``, the old name of ``instr follow --prometheus`` (kept for one release)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("metrics", hidden=True)
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--listen", metavar="HOST:PORT", help="Where to serve /metrics.")
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
    """The old name of `instr follow LOG --prometheus HOST:PORT`."""
    from llamacpp_instr.commands import follow

    if (listen is None) == (listen_fd is None):
        raise click.UsageError("--listen HOST:PORT is required")
    click.get_current_context().invoke(  # type: ignore[misc]
        follow.command.callback,  # type: ignore[arg-type]
        log=log,
        wait=wait,
        prometheus=listen,
        listen_fd=listen_fd,
        after=after,
        parent_pid=parent_pid,
    )
