"""``instr export``: a session log's tables on disk, for DuckDB, Spark or pandas without this
package; its op workloads as JSON lines (``--workloads``); its requests as OpenTelemetry traces
(``--otlp``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llamacpp_instr.cli_shared.deprecated import out_dir_alias
from llamacpp_instr.cli_shared.options import session_option, strict_option
from llamacpp_instr.cli_shared.output import load_log


@click.command("export")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Directory for the tables (with --workloads: a JSONL file; default stdout).",
)
@out_dir_alias
@click.option(
    "--dataset",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Append the session to this hive-partitioned Parquet dataset "
    "(TABLE/model=/quant=/date=/SID.parquet) instead.",
)
@click.option(
    "--workloads",
    is_flag=True,
    help="Each distinct (op, input shapes and types) instead, as JSON lines, biggest first.",
)
@click.option(
    "--otlp",
    metavar="URL",
    help="Send the requests to this OTLP/HTTP traces URL instead, e.g. http://127.0.0.1:4318 "
    "(/v1/traces is added to a URL without a path).",
)
@click.option("--follow", is_flag=True, help="With --otlp: follow LOG as it is written.")
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="With --otlp --follow: seconds to wait for LOG to appear.",
)
@click.option("--layers", is_flag=True, help="With --otlp: a child span per layer of each step.")
@session_option
@strict_option
def command(
    log: Path,
    fmt: str,
    output: Path | None,
    dataset: Path | None,
    workloads: bool,
    otlp: str | None,
    follow: bool,
    wait: float,
    layers: bool,
    sid: str | None,
    strict: bool,
) -> None:
    """Write the tables of a session LOG (steps, layers, ops, nodes, weights, tensor_stats, topk)
    as one Parquet or CSV file each into the -o/--output directory, or append them to a --dataset
    that DuckDB, Polars or Spark query across sessions:
    read_parquet('DIR/steps/**/*.parquet', hive_partitioning = true).

    --workloads: each unique (op, input shapes and types) LOG executed, with its axes (a matmul's
    M, N, K and weight type), count, total and mean time, as JSON lines: the kernels that matter
    for this model, biggest first.

    --otlp URL: the requests of LOG (llama-server's under `instr exec`, or `instr serve`'s) as
    OpenTelemetry traces, sent to a collector: one span per request, from its arrival to the end
    of its response, with a child span per decode step its slot took part in (and per layer, with
    --layers). Attributes follow the GenAI semantic conventions (gen_ai.operation.name,
    gen_ai.request.model, gen_ai.usage.input_tokens, gen_ai.usage.output_tokens) and add the
    request's queue time, time to first token, slot and prompt-cache tokens. --follow reads on as
    LOG is written (a rotated series included) until Ctrl-C or SIGTERM. A collector that is down
    never holds the reading back: a batch is retried, then lost and counted; the exit status is 1
    when some spans were lost.

        instr export server.log --otlp http://127.0.0.1:4318 --follow"""
    from llamacpp_instr.contract.errors import UserError

    if (follow or wait or layers) and otlp is None:
        raise click.UsageError("--follow, --wait and --layers go with --otlp")
    if (otlp is not None or workloads) and (
        dataset is not None or (otlp is not None and (workloads or output is not None))
    ):
        raise click.UsageError("--otlp, --workloads and --dataset go one at a time")
    if otlp is not None:
        from llamacpp_instr.converters.formats.otlp_export import OtlpExport, export

        sent = export(OtlpExport(log, otlp, follow, wait, layers))
        click.echo(sent.summary(), err=True)
        if sent.lost:
            sys.exit(1)
        return
    if workloads:
        _workloads(log, output, sid, strict)
        return
    if (output is None) == (dataset is None):
        raise UserError("give exactly one of -o/--output and --dataset")
    if dataset is not None and fmt != "parquet":
        raise UserError("--dataset is Parquet only")
    from llamacpp_instr.converters.formats.parquet import append_to_dataset, write_tables

    frames = load_log(log, sid, strict)
    if dataset is not None:
        files = append_to_dataset(frames, dataset)
    elif output is not None:
        files = write_tables(frames, output, fmt)
    for path, rows in files:
        click.echo(f"{path}: {rows} rows", err=True)
    if dataset is not None:
        click.echo(f"session {frames.info.sid} added to {dataset} ({len(files)} tables)", err=True)


def _workloads(log: Path, output: Path | None, sid: str | None, strict: bool) -> None:
    """--workloads: each distinct (op, input shapes and types) of the session as a JSON line, to
    ``output`` or stdout, and how many on stderr."""
    import json

    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.summary import workloads

    if output is not None and output.is_dir():
        raise UserError(f"-o/--output is a directory: {output} (--workloads writes a file)")
    rows = workloads(load_log(log, sid, strict))
    out = output.open("w") if output else sys.stdout
    try:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    finally:
        if output:
            out.close()
    click.echo(f"{len(rows)} workloads, {sum(r['count'] for r in rows)} timed ops", err=True)
