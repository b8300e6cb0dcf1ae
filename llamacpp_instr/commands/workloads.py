"""``instr workloads``: the op workload inventory of a run, one JSON line per distinct kernel call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import output_option, session_option, strict_option
from llamacpp_instr.cli_shared.output import load_log


@click.command("workloads", hidden=True)
@click.argument("log", type=click.Path(path_type=Path))
@output_option("JSONL file (default: stdout).")
@session_option
@strict_option
def command(log: Path, output: Path | None, sid: str | None, strict: bool) -> None:
    """The old name of `instr export LOG --workloads`.

    List each unique (op, input shapes and types) a session LOG executed, with its axes (a
    matmul's M, N, K and weight type), count, total and mean time: the kernels that matter for this
    model, biggest first, as JSON lines."""
    import json

    from llamacpp_instr.converters.reports.summary import workloads

    rows = workloads(load_log(log, sid, strict))
    out = output.open("w") if output else sys.stdout
    try:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    finally:
        if output:
            out.close()
    click.echo(f"{len(rows)} workloads, {sum(r['count'] for r in rows)} timed ops", err=True)
