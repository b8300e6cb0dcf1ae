"""``instr workloads``: the op workload inventory of a run, one JSON line per distinct kernel call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llamacpp_instr.commands import session_option


@click.command("workloads")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="JSONL file (default: stdout).",
)
@session_option
def command(log: Path, output: Path | None, sid: str | None) -> None:
    """List each unique (op, input shapes and types) a session LOG executed, with its axes (a
    matmul's M, N, K and weight type), count, total and mean time: the kernels that matter for this
    model, biggest first, as JSON lines."""
    import json

    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.summary import workloads

    rows = workloads(load_session(log, sid))
    out = output.open("w") if output else sys.stdout
    try:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    finally:
        if output:
            out.close()
    click.echo(f"{len(rows)} workloads, {sum(r['count'] for r in rows)} timed ops", err=True)
