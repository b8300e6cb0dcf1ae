"""``instr fit``: the largest context, the most offloaded layers and the KV cache type that fit each
device's memory, from llama.cpp's own projection (``llamacpp_instr.deciding.fit``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import (
    experts_option,
    memory_option,
    quant_option,
    text_json_option,
    threads_option,
)
from llamacpp_instr.cli_shared.output import answer

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("fit")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@memory_option
@click.option(
    "--ctx",
    "n_ctx",
    type=click.IntRange(min=1),
    default=None,
    help="The largest context to consider, in tokens (default: the model's n_ctx_train).",
)
@offload_options(layers_default="the most that fit, searched")
@quant_option(
    "Answer for the model quantized to TYPE too (repeatable; quantized into the cache with "
    "the pinned llama.cpp's quantizer, as instr quantize does). Default: the file's own."
)
@click.option(
    "--mmproj",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="Count a multimodal projector (llama.cpp's mmproj file, for images or sounds) too: its "
    "weights and its compute buffers for the largest input it takes, on the device its encoder "
    "runs on, by llama.cpp's own measure (mtmd_get_memory_usage, as llama-server's fit).",
)
@click.option(
    "--no-mmproj-offload",
    "no_mmproj_offload",
    is_flag=True,
    help="Count the projector on the CPU, as llama.cpp's option of that name runs its encoder "
    "(default: on the first --device, else the first GPU, as llama.cpp runs it).",
)
@threads_option
@text_json_option("text: a table per quantization; json: one object per quantization.")
@click.option(
    "--compare-llama",
    is_flag=True,
    help="Show llama.cpp's own projection (llama-fit-params --fit-print, of instr build --tools) "
    "at the same setting, under a memory budget of the same memory (shown without it when the "
    "program is built).",
)
@click.option(
    "--measure",
    is_flag=True,
    help="Run the setting for real (instr run, two tokens, under a memory budget of the same "
    "memory) and show its live buffers per device and purpose.",
)
@experts_option
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="With --experts: a detailed log of a run of this model, to price the placements "
    "(repeatable).",
)
def command(
    model: Path | None,
    memory_specs: tuple[str, ...],
    n_ctx: int | None,
    offload: Offload,
    quants: tuple[str, ...],
    mmproj: Path | None,
    no_mmproj_offload: bool,
    threads: int | None,
    fmt: str,
    compare_llama: bool,
    measure: bool,
    experts: bool,
    logs: tuple[Path, ...],
) -> None:
    """What fits MODEL.gguf (default: the bundled SmolLM2-135M-Instruct) in each device's memory.

    For each quantization, the largest context (a multiple of 256, up to --ctx or the model's
    n_ctx_train), the most layers offloaded (when a GPU exists; -ngl fixes it) and the KV cache
    type (f16, then q8_0 with flash attention) that fit, and the whole footprint per device and
    purpose there. It asks llama.cpp: the model is loaded with no weights read and the real graphs
    are reserved without allocating (as llama-fit-params does), with the context parameters instr
    run uses, so the answer is what a run of it measures. Prints the instr run options of the
    answer.
    """
    from llamacpp_instr.contract.errors import UserError

    if experts and mmproj is not None:
        raise UserError("--mmproj counts a projector in fit's answer, not in --experts' placements")
    if experts:  # (the context: --ctx, else the first log's)
        from llamacpp_instr.deciding import moe_report
        from llamacpp_instr.deciding.moe_plan import PlacementRequest, moe_plan
        from llamacpp_instr.running.measuring import ThisMachine

        placed = moe_plan(
            PlacementRequest(model, logs, memory_specs, n_ctx, offload), ThisMachine()
        )
        answer(moe_report.report(placed), fmt, placed.failure())
        return
    if logs:
        raise UserError("--log prices expert placements: give --experts too")
    from llamacpp_instr.deciding import fit_report
    from llamacpp_instr.deciding.fit import FitRequest, fit
    from llamacpp_instr.running.measuring import ThisMachine

    source = click.get_current_context().get_parameter_source("gpu_layers")
    ngl = offload.gpu_layers  # searched unless given
    given = source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    request = FitRequest(
        model=model,
        memory=memory_specs,
        n_ctx=n_ctx,
        gpu_layers=(10**6 if ngl == "all" else int(ngl)) if given else None,
        offload=offload,
        quants=quants,
        threads=threads,
        compare_llama=compare_llama,
        measure=measure,
        mmproj=mmproj,
        mmproj_offload=not no_mmproj_offload,
    )
    result = fit(request, ThisMachine(), say=lambda line: click.echo(line, err=True))
    answer(fit_report.report(result), fmt, result.failure())
