"""``instr quantize``: quantize a GGUF with the pinned llama.cpp's own quantizer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import click

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s",
         "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "f16", "bf16", "f32"]  # fmt: skip


def _ftype(llama_cpp: object, name: str) -> int:
    attr = "LLAMA_FTYPE_ALL_F32" if name == "f32" else f"LLAMA_FTYPE_MOSTLY_{name.upper()}"
    return int(getattr(llama_cpp, attr))


FTYPES = TYPES


def quantize_file(
    src: Path,
    output: Path,
    qtype: str,
    threads: int = 0,
    progress: Callable[[float], None] | None = None,
) -> None:
    """llama_model_quantize of the pinned build (in a thread, so ``progress`` can report)."""
    from llamacpp_instr import bindings
    from llamacpp_instr.converters.errors import UserError

    llama_cpp = bindings.import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _ftype(llama_cpp, qtype)
    params.nthread = threads
    params.allow_requantize = True
    done = threading.Event()
    rc: list[int] = []

    def work() -> None:
        rc.append(
            llama_cpp.llama_model_quantize(
                str(src).encode(), str(output).encode(), llama_cpp.byref(params)
            )
        )
        done.set()

    t0 = time.monotonic()
    threading.Thread(target=work, daemon=True).start()
    while not done.wait(2.0):
        if progress:
            progress(time.monotonic() - t0)
    if rc[0] != 0 or not output.is_file():
        raise UserError(f"llama_model_quantize failed ({rc[0]}) for {src} -> {qtype}")


@click.command("quantize")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--type", "qtype", required=True, help=f"Target type: {', '.join(TYPES)}.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output GGUF.")
@click.option("--threads", type=int, default=0, help="Threads (0 = all cores).")
def command(src: Path, qtype: str, output: Path, threads: int) -> None:
    """Quantize SRC.gguf to --type with llama.cpp's llama_model_quantize (the pinned build), e.g.
    the Q4_K_M / Q8_0 pair from the bundled SmolLM2. Warns when SRC is already quantized (quality
    compounds)."""
    from llamacpp_instr.converters.errors import UserError
    from llamacpp_instr.converters.quant_report import from_gguf

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

    quantize_file(src, output, qtype, threads, progress=tick)
    out = from_gguf(output)
    click.echo(
        f"wrote {output}: {out.bytes / 1e6:.1f} MB ({inv.bytes / 1e6:.1f} MB before), "
        f"{out.bpw:.2f} bits per weight, in {time.monotonic() - t0:.1f}s",
        err=True,
    )
