"""``instr predict``: prompt and generation tokens/s for a setting not run, priced op by op from
the ops that detailed logs measured (``llamacpp_instr.deciding.prediction.predict``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from llamacpp_instr.commands import (
    offload_options,
    quant_option,
    text_json_option,
    threads_option_with,
)

if TYPE_CHECKING:
    from llamacpp_instr.deciding.prediction.predict import Interval, Prediction
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
@click.option(
    "--rpc-rate",
    "rpc_rate",
    metavar="RATE",
    default=None,
    help="Price the RPC servers' network at this rate, in bits/s (100M, 1G, 2.5Gbit); the "
    "log's measured rate without it.",
)
@click.option(
    "--rpc-rtt",
    "rpc_rtt",
    metavar="TIME",
    default=None,
    help="Price the RPC servers' network at this round trip (2ms, 500us); the log's measured "
    "one without it.",
)
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
    fmt: str,
) -> None:
    """Predict prompt and generation tokens/s for a setting not run, from LOGS (detailed logs of
    runs on this machine; several: each priced where it is closest).

    The setting is the first log's, with the options given changed. Its graphs are built for real:
    the model is loaded without its weights and llama.cpp builds (never computes) the graph of
    every ubatch the run would compute, at the KV size it would have. Each op is priced from the
    ops the logs measured of its kind, on its device, at its thread count: an efficiency against
    the device's roofs and a fixed cost per op, fitted per op class; on several devices each split
    adds its device's time beyond its ops and the copies into it, as the logs measured them. An
    RPC server's ops are priced from the ops it timed, and its network per command: round trips
    times the link's round trip plus bytes at its rate, the link measured in the log unless
    --rpc-rate or --rpc-rtt give another (a log's RPC servers are stood in for on loopback to build
    the graphs, unless --rpc names live ones). The result is a prediction with a 95 % interval:
    from the logs predicted from each other (leave one out), or where none could be held out the
    model's error on the project's benchmark grids (x/÷ 1.22) or its spread on the logs' own
    steps, the wider. A CPU thread count no log ran is priced from the nearest one run with what
    instr peaks measured of this machine at both (without them, not covered: the instr peaks to
    run is named): memory-bound ops at the bandwidth of the new count, compute-bound ones by the
    threads, an op of one row on one thread at both; the output says which each op is. A context
    deeper than the logs' prices attention (the KQ and KQV matmuls and their softmax, or flash
    attention by the cells its rows see) by its measured cost per KV cell, labelled an
    extrapolation, up to 17x the KV cells the logs read (what the project's benchmark checks).
    What no log measured (threads beyond the machine's CPUs, a weight type never run, a device,
    ops of more work than the logs' did: a longer prompt or ubatch, a context deeper than that)
    is listed with the run that would measure it, and that speed is not given (exit 2). A
    context beyond the model's n_ctx_train is refused (exit 2). An op
    its device never ran, of a kind it did, is priced from that kind and listed ("priced from
    other ops": a matmul of a weight type the logs ran on another device only, as the device's
    matmul of another type of the same shape; a binary op from another).
    Op offload is priced: a prompt's matmuls ggml runs on a GPU though their weights are on the
    host (-ngl 0 on a Vulkan build), with the weights' copies at the logs' copy rate.
    """
    if spec_n_max is not None:  # speculative decoding: from the logs' verifies alone
        from llamacpp_instr.deciding.prediction import spec_predict

        doc = spec_predict.run(list(logs), spec_n_max, n_predict)
        click.echo(json.dumps(doc, indent=1) if fmt == "json" else spec_predict.render(doc))
        return
    from llamacpp_instr.commands.fit import _files
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.deciding.prediction import net_costs, predict
    from llamacpp_instr.native import models

    rate_bits = rtt_ns = None
    try:
        rate_bits = net_costs.parse_rate(rpc_rate) if rpc_rate is not None else None
    except ValueError:
        raise UserError(
            f"--rpc-rate takes a rate in bits/s above 0 (100M, 1G, 2.5Gbit), not {rpc_rate!r}"
        ) from None
    try:
        rtt_ns = net_costs.parse_duration_ns(rpc_rtt) if rpc_rtt is not None else None
    except ValueError:
        raise UserError(
            f"--rpc-rtt takes a time of at least 0 with its unit (2ms, 500us), not {rpc_rtt!r}"
        ) from None
    if model is not None:
        models.check_gguf(model)
    sessions = predict.load_logs(list(logs))
    base = predict.default_target(sessions[0], model)
    changes: dict[str, Any] = {
        "threads": threads,
        "n_ubatch": n_ubatch,
        "n_batch": n_batch,
        "n_prompt": n_prompt,
        "n_gen": n_predict,
        "depth": depth,
        "rpc_rate": rate_bits,
        "rpc_rtt_ns": rtt_ns,
    }
    base = replace(base, **{k: v for k, v in changes.items() if v is not None})
    # the log's placement, unless one is given here
    ctx = click.get_current_context()
    given = ("gpu_layers", "device", "rpc", "tensor_split")
    if any(ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE for p in given):
        base = replace(base, offload=offload)
    if (rate_bits is not None or rtt_ns is not None) and not (base.rpc_servers or base.offload.rpc):
        raise UserError(
            "--rpc-rate and --rpc-rtt price RPC servers' network: the log ran on none, and "
            "--rpc names none"
        )
    files = _files(base.model, quants) if quants else [("", base.model)]
    cost_model = predict.fit(sessions)
    names = [str(p) for p in logs]
    results = [
        predict.price(replace(base, model=file), cost_model, sessions, names) for _q, file in files
    ]
    if fmt == "json":
        docs = [r.to_json() for r in results]
        # one object for one setting; a list, one per --quant, for several
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1))
    else:
        click.echo("\n".join(render(r) for r in results))
    n_missing = sum(len(r.not_covered) for r in results)
    if n_missing:
        raise UserError(f"not covered: {n_missing} thing(s) no log measured (listed above)")


def _rate(name: str, i: Interval | None) -> str:
    if i is None:
        return f"  {name:<11} not predicted (not covered)"
    return f"  {name:<11} {i.value:9.1f} tokens/s   ({i.low:.1f} to {i.high:.1f})"


def _basis(p: Prediction) -> str:
    """What the intervals are made of (``intervals``)."""
    iv = p.gen or p.prompt
    if iv is None:
        return "nothing predicted."
    if iv.basis == "held-out":
        return (
            f"95 % intervals from how far {iv.held_out} log(s) were from their prediction by the "
            "others (leave one out)."
        )
    return (
        "no log could be predicted from the others: the intervals are the model's error on the "
        f"project's benchmark grids (x/÷ {iv.high / iv.value:.2f} here) or the logs' own steps' "
        "spread, the wider (add logs of other settings for intervals from these logs)."
    )


def render(p: Prediction) -> str:
    # a log from a busy machine first, as summary says it
    lines = [f"WARNING, a log from a busy machine: {line}" for line in p.contended]
    lines.append(f"prediction for {p.target.describe()}:")
    lines.append(_rate("prompt", p.prompt))
    lines.append(_rate("generation", p.gen))
    for kind, name in (("gen", "generation"), ("prompt", "prompt")):
        ops = p.by_op.get(kind)
        if not ops:
            continue
        top = ", ".join(f"{op} {share:.0%}" for op, share in list(ops.items())[:5])
        devs = ", ".join(f"{d} {s:.0%}" for d, s in p.by_device.get(kind, {}).items())
        lines.append(f"  where {name} time goes: {top}; by device: {devs}")
    if p.links and any("network" in d for d in p.by_device.values()):
        links = ", ".join(
            f"{d} {lk['rate_bits_per_s'] / 1e6:.4g} Mbit/s, round trip {lk['rtt_ns'] / 1e6:.3g} ms"
            for d, lk in p.links.items()
        )
        lines.append(f"  network priced at: {links}")
    lines.append(
        f"  from {len(p.logs)} log(s) ({', '.join(Path(x).name for x in p.logs)}); "
        f"{p.graphs} graph(s) built by llama.cpp without weights. A prediction, not a "
        f"measurement; {_basis(p)}"
    )
    if p.threads_from:
        lines.append(f"  threads: {p.threads_from}")
    for line in p.priced_from_others:
        lines.append(f"  priced from other ops: {line}")
    for line in p.extrapolated:
        lines.append(f"  extrapolated: {line}")
    for line in p.not_covered:
        lines.append(f"  not covered: {line}")
    return "\n".join(lines)
