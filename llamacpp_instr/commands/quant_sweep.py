"""``instr quant-sweep``: quantize one base model to several types and measure each."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.deprecated import chunk_size_options
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import report_options, threads_option
from llamacpp_instr.cli_shared.output import check_output, emit

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("quant-sweep")
@click.argument("base", type=click.Path(path_type=Path))
@click.option(
    "--types",
    default="q8_0,q6_k,q5_k_m,q4_k_m,q3_k_m,q2_k",
    show_default=True,
    help="Comma-separated quantization types.",
)
@click.option(
    "--text",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Text for perplexity and KL divergence (default: the bundled public-domain text).",
)
@chunk_size_options
@click.option(
    "--chunks",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Chunks of the text to score.",
)
@click.option(
    "--reps",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Interleaved speed repetitions per type.",
)
@click.option(
    "-n",
    "--n-predict",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Tokens generated per speed run.",
)
@threads_option
@offload_options()
@report_options()
def command(
    base: Path,
    types: str,
    text: Path | None,
    chunk_size: int,
    chunks: int,
    reps: int,
    n_predict: int,
    threads: int | None,
    offload: Offload,
    fmt: str,
    output: Path | None,
) -> None:
    """Quantize BASE.gguf (ideally F16 or F32) to each of --types with the pinned quantizer (cached
    by the base's hash and the type) and measure each: file size, bits per weight, run-time memory,
    prompt and generation tokens/s (interleaved repetitions, as ratios to BASE), perplexity and KL
    divergence against BASE. The HTML charts size against KLD and speed against KLD, with the
    Pareto fronts marked."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.quant.sweep_report import sweep_report
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.running.quant.quantize import TYPES
    from llamacpp_instr.running.quant.sweep import sweep

    wanted = [t.strip().lower() for t in types.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TYPES]
    if unknown or not wanted:
        raise UserError(
            f"unknown type(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(TYPES)}"
        )
    check_output(output)

    def echo(msg: str) -> None:
        click.echo(msg, err=True)

    data = sweep(
        base, wanted, text=text, ctx=chunk_size, chunks=chunks, reps=reps, n_predict=n_predict,
        threads=threads, echo=echo, offload=offload,
    )  # fmt: skip
    emit(render(sweep_report(data), fmt), output)
