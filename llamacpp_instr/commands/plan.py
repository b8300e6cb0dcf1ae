"""``instr plan``: the settings of a model that fit the memory given, ranked by predicted speed
(``llamacpp_instr.deciding.plan``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import (
    ctx_option,
    experts_option,
    memory_option,
    quant_option,
    text_json_option,
)
from llamacpp_instr.cli_shared.output import answer

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("plan")
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("logs", nargs=-1, type=click.Path(path_type=Path))
@memory_option
@ctx_option
@quant_option(
    "Consider the model quantized to TYPE too (repeatable; quantized into the cache, as "
    "instr fit --quant does). Default: the file's own."
)
@click.option(
    "--quality",
    type=click.Path(path_type=Path, dir_okay=False),
    multiple=True,
    metavar="FILE",
    help="A quant-eval report (instr quant-eval --format json) of these quantizations, or of a KV "
    "cache type (quant-eval -ctk/-ctv; repeatable): each setting's mean KL divergence from the "
    "base, for its quantization and KV cache, joins the Pareto front.",
)
@offload_options(layers_default="0, and all too where a GPU option is given: both ranked")
@experts_option
@text_json_option("text: a ranked table; json: one object per setting.")
def command(
    model: Path,
    logs: tuple[Path, ...],
    memory_specs: tuple[str, ...],
    n_ctx: int,
    quants: tuple[str, ...],
    quality: tuple[Path, ...],
    offload: Offload,
    experts: bool,
    fmt: str,
) -> None:
    """Rank the settings of MODEL.gguf that fit the memory, by speed predicted from LOGS.

    Candidates: each --quant, each thread count the LOGS ran, their ubatch and 512, an f16 KV
    cache and a q8_0 one with flash attention, and (with a GPU) no layers or all offloaded. Each is
    checked against the memory at --ctx (the context every setting must hold) with llama.cpp's own projection (as instr fit does), and
    priced from the logs' measured ops (as instr predict does): tokens/s for the first log's
    prompt and generation lengths, with intervals. The Pareto front of memory, generation and
    prompt speed (and, with --quality, the KL divergence from the base of the quantization with
    the setting's KV cache: quant-eval reports of the quants, and of -ctk/-ctv) is marked,
    and each setting comes with the instr run command that runs it. A setting no log covers stays
    in the list, unranked, with what to run.
    """
    if experts:
        from llamacpp_instr.deciding import moe_report
        from llamacpp_instr.deciding.moe_plan import PlacementRequest, moe_plan
        from llamacpp_instr.running.measuring import ThisMachine

        placed = moe_plan(
            PlacementRequest(model, logs, memory_specs, n_ctx, offload), ThisMachine()
        )
        answer(moe_report.report(placed), fmt, placed.failure())
        return
    from llamacpp_instr.deciding import plan_report
    from llamacpp_instr.deciding.plan import PlanRequest, plan
    from llamacpp_instr.running.measuring import ThisMachine

    request = PlanRequest(model, logs, memory_specs, n_ctx, quants, quality, offload)
    result = plan(request, ThisMachine(), say=lambda line: click.echo(line, err=True))
    answer(plan_report.report(result), fmt, result.failure())
