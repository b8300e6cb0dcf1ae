"""``instr quantize``: quantize a GGUF with the pinned llama.cpp's own quantizer."""

from __future__ import annotations

import time
from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import output_option, threads_option
from llamacpp_instr.running.quant.quantize import TYPES


@click.command("quantize")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--type", "qtype", required=True, help=f"Target type: {', '.join(TYPES)}.")
@output_option("Output GGUF.", required=True)
@threads_option
def command(src: Path, qtype: str, output: Path, threads: int | None) -> None:
    """Quantize SRC.gguf to --type with llama.cpp's llama_model_quantize (the pinned build), e.g.
    the Q4_K_M / Q8_0 pair from the bundled SmolLM2. Warns when SRC is already quantized (quality
    compounds)."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.quant.inventory import from_gguf
    from llamacpp_instr.running.quant.quantize import quantize_file
    from llamacpp_instr.running.runner import resolve_threads

    qtype = qtype.lower()
    if qtype not in TYPES:
        raise UserError(f"unknown --type {qtype!r}; choose one of {', '.join(TYPES)}")
    inv = from_gguf(src)  # exists, is a GGUF, is complete
    quantized = sorted({t.type for t in inv.tensors} - {"f32", "f16", "bf16"})
    if quantized:
        click.echo(
            f"warning: {src} is already quantized ({', '.join(quantized)}); requantizing loses more "
            "quality than quantizing from F16/F32",
            err=True,
        )
    if output.parent and not output.parent.is_dir():
        raise UserError(f"cannot write {output}: directory {output.parent} does not exist")
    t0 = time.monotonic()

    def tick(elapsed: float) -> None:
        click.echo(f"  quantizing {src.name} to {qtype} ... {elapsed:.0f}s", err=True)

    quantize_file(src, output, qtype, resolve_threads(threads), progress=tick)
    out = from_gguf(output)
    click.echo(
        f"wrote {output}: {out.bytes / 1e6:.1f} MB ({inv.bytes / 1e6:.1f} MB before), "
        f"{out.bpw:.2f} bits per weight, in {time.monotonic() - t0:.1f}s",
        err=True,
    )
