"""``instr quant-eval``: perplexity and KL divergence of quantized models against a base, as
``llama-perplexity --kl-divergence`` computes them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.deprecated import chunk_size_options
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import kv_type_options, report_options, threads_option
from llamacpp_instr.cli_shared.output import check_output, emit

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("quant-eval")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("quants", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--text",
    "text",
    type=click.Path(path_type=Path),
    metavar="FILE",
    default=None,
    help="Text to evaluate on (default: the bundled KJV Genesis, about 49k SmolLM2 tokens).",
)
@chunk_size_options
@click.option(
    "--chunks",
    type=click.IntRange(min=1),
    default=None,
    help="Evaluate only the first N chunks (default: all full chunks).",
)
@threads_option
@kv_type_options
@click.option(
    "--flash-attn/--no-flash-attn",
    "flash_attn",
    default=None,
    help="Flash attention for every model (default: llama.cpp's auto, as llama-perplexity).",
)
@offload_options()
@click.option(
    "--all-positions",
    is_flag=True,
    help="The KL divergence by context position over every position of each chunk, the "
    "unscored first half too (its logits are output as well: twice the output buffer).",
)
@click.option(
    "--layers/--no-layers",
    default=False,
    show_default=True,
    help="Also measure where the error enters: each layer's residual stream, attention and FFN "
    "outputs of each quant against the base's, captured natively on the same chunks.",
)
@report_options()
def command(
    base: Path,
    quants: tuple[Path, ...],
    text: Path | None,
    chunk_size: int,
    chunks: int | None,
    threads: int | None,
    type_k: str,
    type_v: str,
    flash_attn: bool | None,
    offload: Offload,
    all_positions: bool,
    layers: bool,
    fmt: str,
    output: Path | None,
) -> None:
    """Perplexity of BASE.gguf and of each QUANT.gguf on the same tokens, and each quant's KL
    divergence from the base: mean, median, 90/95/99/99.9th percentiles and max per token, Δp (the
    change in the correct token's probability) and how often the top token agrees; with the
    definitions and uncertainties of llama.cpp's `llama-perplexity --kl-divergence`. The text is
    tokenized once with the base's tokenizer and cut into chunks of --chunk-size tokens, evaluated
    teacher-forced from an empty cache; the second half of each chunk is scored.

    -ctk/-ctv give the quants' KV cache (the base's stays f16, the reference): the divergence is
    then their weights' and their cache's together; with no QUANT, the base itself with that
    cache is compared with the base (what the cache alone costs). The KL divergence by context
    position (the scored positions, or with --all-positions every position of a chunk, in bins)
    shows the error as the cache fills."""
    from llamacpp_instr.converters.reports.quant.eval_report import build
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.renderers.progress import chunks_bar
    from llamacpp_instr.running.quant import evaluate as quant_eval

    check_output(output)
    tty = sys.stderr.isatty()
    data = quant_eval.evaluate_quants(
        base,
        quants,
        text=text,
        ctx=chunk_size,
        chunks=chunks,
        threads=threads,
        progress=chunks_bar() if tty else None,
        offload=offload,
        kv=quant_eval.KvCache(type_k, type_v, flash_attn),
        all_positions=all_positions,
        layers=layers,
        say=lambda line: click.echo(line, err=True) if tty else None,
    )
    emit(render(build(data), fmt), output)
