"""``instr export``: a session log's tables on disk, for DuckDB, Spark or pandas without this package."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.commands import session_option


@click.command("export")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True
)
@click.option(
    "-o",
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for the files.",
)
@session_option
def command(log: Path, fmt: str, out_dir: Path, sid: str | None) -> None:
    """Write the tables of a session LOG (steps, layers, ops, nodes, weights, tensor_stats, topk)
    as one Parquet or CSV file each into --out-dir."""
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.errors import UserError

    frames = load_session(log, sid)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, df in frames.tables().items():
            path = out_dir / f"{name}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False)
            click.echo(f"{path}: {len(df)} rows", err=True)
    except OSError as exc:
        raise UserError(f"cannot write to {out_dir}: {exc.strerror}") from None
