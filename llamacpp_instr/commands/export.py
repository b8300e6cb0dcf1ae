"""``instr export``: a session log's tables on disk, for DuckDB, Spark or pandas without this package."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.commands.deprecated import out_dir_alias
from llamacpp_instr.commands.options import output_option, session_option, strict_option
from llamacpp_instr.commands.output import load_log


@click.command("export")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True
)
@output_option("Directory for the files.", directory=True)
@out_dir_alias
@click.option(
    "--dataset",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Append the session to this hive-partitioned Parquet dataset "
    "(TABLE/model=/quant=/date=/SID.parquet) instead.",
)
@session_option
@strict_option
def command(
    log: Path, fmt: str, output: Path | None, dataset: Path | None, sid: str | None, strict: bool
) -> None:
    """Write the tables of a session LOG (steps, layers, ops, nodes, weights, tensor_stats, topk)
    as one Parquet or CSV file each into the -o/--output directory, or append them to a --dataset that DuckDB,
    Polars or Spark query across sessions:
    read_parquet('DIR/steps/**/*.parquet', hive_partitioning = true)."""
    from llamacpp_instr.contract.errors import UserError

    if (output is None) == (dataset is None):
        raise UserError("give exactly one of -o/--output and --dataset")
    if dataset is not None and fmt != "parquet":
        raise UserError("--dataset is Parquet only")
    frames = load_log(log, sid, strict)
    if dataset is not None:
        from llamacpp_instr.converters.formats.parquet import append_to_dataset

        files = append_to_dataset(frames, dataset)
        for path, rows in files:
            click.echo(f"{path}: {rows} rows", err=True)
        click.echo(f"session {frames.info.sid} added to {dataset} ({len(files)} tables)", err=True)
        return
    assert output is not None
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, df in frames.tables().items():
            path = output / f"{name}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False)
            click.echo(f"{path}: {len(df)} rows", err=True)
    except OSError as exc:
        raise UserError(f"cannot write to {output}: {exc.strerror}") from None
