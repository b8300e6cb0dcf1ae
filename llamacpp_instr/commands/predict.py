"""``instr predict``: prompt and generation tokens/s for a setting not run, priced op by op from
the ops that detailed logs measured (``llamacpp_instr.deciding.prediction.predict``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import (
    quant_option,
    rpc_link_options,
    text_json_option,
    threads_option_with,
)
from llamacpp_instr.cli_shared.output import answer

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("predict")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@threads_option_with("the first log's")
@click.option(
    "--batch", "n_batch", type=click.IntRange(min=1), default=None, help="Tokens per llama_decode."
)
@click.option(
    "--ubatch", "n_ubatch", type=click.IntRange(min=1), default=None, help="Tokens per compute."
)
@click.option(
    "--prompt-tokens", "n_prompt", type=click.IntRange(min=0), default=None, help="Prompt tokens."
)
@click.option(
    "-n",
    "--n-predict",
    type=click.IntRange(min=0),
    default=None,
    help="Tokens generated after the prompt.",
)
@click.option(
    "--ctx-depth",
    "depth",
    type=click.IntRange(min=0),
    default=None,
    help="Tokens already in the KV cache before the prompt (llama-bench's -d).",
)
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Another GGUF of the same architecture (another quantization, say).",
)
@quant_option(
    "Predict the model quantized to TYPE (repeatable: one prediction each; quantized into "
    "the cache, as instr fit --quant does)."
)
@offload_options(layers_default="the first log's placement")
@rpc_link_options
@click.option(
    "--spec-draft-n-max",
    "spec_n_max",
    metavar="N",
    type=click.IntRange(min=0),
    default=None,
    help="Speculative decoding: generation tokens/s at this draft length, from llama-server logs "
    "that ran the same draft (or n-gram type) at others: their acceptance by draft position and "
    "their batch costs (0: no speculation); with the length that would be fastest.",
)
@click.option(
    "--probe/--no-probe",
    default=True,
    show_default=True,
    help="Run on this machine (the logs'): attention deeper than the logs' KV cells, at that "
    "depth, and at another thread count a generated token's matmuls of the model's shapes, at "
    "both counts in turn; or price the first by its cost per cell in the logs (an extrapolation, "
    "up to 17x their cells), the second by instr peaks' one-column matmul.",
)
@text_json_option(
    "text: tokens/s and where the time goes; json: prompt_tokens_per_s and "
    "gen_tokens_per_s as {value, low, high}, by_device (with network over RPC), by_op, rpc_links, "
    "not_covered (a list of such objects for several --quant)."
)
def command(
    logs: tuple[Path, ...],
    threads: int | None,
    n_batch: int | None,
    n_ubatch: int | None,
    n_prompt: int | None,
    n_predict: int | None,
    depth: int | None,
    model: Path | None,
    quants: tuple[str, ...],
    offload: Offload,
    rpc_rate: str | None,
    rpc_rtt: str | None,
    spec_n_max: int | None,
    probe: bool,
    fmt: str,
) -> None:
    """Predict prompt and generation tokens/s for a setting not run, from LOGS (detailed logs of
    runs on this machine; several: each priced where it is closest).

    The setting is the first log's, with the options given changed. llama.cpp builds (never
    computes) the graph of every ubatch the run would compute, the model loaded without its
    weights, and each op is priced from the ops the logs measured of its kind, on its device, at
    its thread count (an efficiency against the device's roofs and a fixed cost per op, per op
    class); on several devices each split adds its device's time beyond its ops and the copies
    into it, as measured; an RPC server's ops are priced from the ops it timed and its network per
    command, at the link the log measured unless --rpc-rate or --rpc-rtt give another (its
    servers stood in for on loopback unless --rpc names live ones). The result has a 95 %
    interval: from the logs predicted from each other (leave one out), or else the model's error
    on the project's benchmark grids (x/÷ 1.20) or its spread on the logs' own steps, the wider.
    A CPU thread count no log ran is priced from the nearest one run with what instr peaks
    measured of this machine at both (without them, not covered, the instr peaks to run named):
    a generated token's matmuls by graphs of the model's own weight shapes run on this machine at
    both counts in turn (the logs'; else, or with --no-probe, by instr peaks' one-column matmul of
    their type), other
    memory-bound ops by the bandwidth, compute-bound matmuls by the matmul throughput, other
    compute-bound ones by the threads, an op of one row on one thread at both; the output says
    which each op is. A context deeper than the logs' prices attention (KQ, softmax and KQV, or
    flash attention) at their most KV cells plus what a probe measures it to take more at the
    target's depth, run as llama.cpp's graph runs it, on this machine (the logs'; else, or with
    --no-probe, per KV cell, an extrapolation up to 17x the logs' cells, what the project's
    benchmark checks). What no log measured (threads beyond the machine's CPUs, a weight type
    never run, a device, ops of more work than the logs' did: a longer prompt or ubatch) is listed
    with the run that would measure it, and that speed is not given (exit 2). A context beyond
    the model's n_ctx_train is refused (exit 2). An op its device never ran, of a kind it did, is
    priced from that kind and listed ("priced from other ops": a matmul of a weight type the logs
    ran on another device only, as the device's matmul of another type of the same shape; a
    binary op from another). Op offload is priced: a prompt's matmuls ggml runs on a GPU though
    their weights are on the host (-ngl 0 on a Vulkan build), with the weights' copies at the
    logs' copy rate.
    """
    from llamacpp_instr.deciding import predict_report
    from llamacpp_instr.deciding.prediction.entry import PredictRequest, predict_setting
    from llamacpp_instr.running.measuring import ThisMachine

    # the log's placement, unless one is given here
    ctx = click.get_current_context()
    given = ("gpu_layers", "device", "rpc", "tensor_split")
    placed = any(ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE for p in given)
    request = PredictRequest(
        logs, threads, n_batch, n_ubatch, n_prompt, n_predict, depth, model, quants,
        offload if placed else None, rpc_rate, rpc_rtt, spec_n_max, probe,
    )  # fmt: skip
    result = predict_setting(request, ThisMachine(), say=lambda line: click.echo(line, err=True))
    answer(predict_report.report(result), fmt, result.failure())
