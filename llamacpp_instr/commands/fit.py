"""``instr fit``: the largest context, the most offloaded layers and the KV cache type that fit each
device's memory, from llama.cpp's own projection (``llamacpp_instr.deciding.fit``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from llamacpp_instr.commands.experts_placement import experts_option, rank_experts
from llamacpp_instr.commands.offload_options import offload_options
from llamacpp_instr.commands.options import (
    memory_option,
    quant_option,
    text_json_option,
    threads_option,
)

if TYPE_CHECKING:
    from llamacpp_instr.deciding.fit import Answer, Footprint
    from llamacpp_instr.running.offload import Offload

# the columns of the text table, in this order; other purposes follow
PURPOSES = ("weights", "kv_cache", "compute", "output")


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
    from llamacpp_instr.deciding import fit
    from llamacpp_instr.native import bindings, models
    from llamacpp_instr.running import devices
    from llamacpp_instr.running.memory_budget import OutOfMemory

    path = model if model is not None else models.default_model()
    models.check_gguf(path)
    bindings.load()
    if offload.rpc and (compare_llama or measure):
        # this process holds each server's one connection while it answers
        raise UserError(
            "--compare-llama and --measure can't share --rpc servers with instr fit (a server "
            "serves one client at a time): run them without --rpc"
        )
    devices.add_rpc_servers(offload.rpc)  # --rpc's servers become devices --memory may name
    memory = fit.parse_memory(memory_specs)
    if experts:
        # (the context: --ctx, else the first log's)
        rank_experts(path, list(logs), {**fit.device_memory(), **memory}, n_ctx, offload, fmt)
        return
    if logs:
        raise UserError("--log prices expert placements: give --experts too")
    ngl_given = click.get_current_context().get_parameter_source("gpu_layers") in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )
    gpu_layers = offload.gpu_layers
    fc = fit.FitConfig(
        model=path,
        memory=memory,
        n_ctx=n_ctx,
        gpu_layers=((10**6 if gpu_layers == "all" else int(gpu_layers)) if ngl_given else None),
        offload=offload,
        threads=threads,
    )
    files = _files(path, quants)
    # llama-fit-params beside ours: asked for, or on its own when it is built and the setting
    # is the CPU's alone (the tools are built for the CPU: a device such as Vulkan0 is not in them)
    exe = (
        None
        if offload.rpc or (offload.devices and not compare_llama)
        else _fit_params_program(required=compare_llama)
    )
    answers = []
    for quant, file in files:
        answer = fit.fit_model(file, quant, fc)
        budget = {dev: answer.memory[dev] for dev in answer.footprint if dev in answer.memory}
        if answer.setting is not None and exe is not None:
            try:
                answer.llama_fit = fit.llama_fit_params(exe, answer, fc, budget)
            except UserError as exc:
                if compare_llama:
                    raise
                click.echo(f"instr fit: llama-fit-params not shown: {exc}", err=True)
        if answer.setting is not None and measure:
            with tempfile.TemporaryDirectory() as tmp:
                answer.measured = fit.measure(answer, fc, budget, Path(tmp) / "measure.log")
        answers.append(answer)
    if fmt == "json":
        click.echo(json.dumps([a.to_json() for a in answers], indent=1))
    else:
        for answer in answers:
            click.echo(render(answer))
    if not any(a.setting for a in answers):
        # as a run that does not fit: exit 3 (bad input is 2)
        over = sorted({dev for a in answers for dev in a.overflow})
        raise OutOfMemory(f"nothing fits: the smallest setting overflows {', '.join(over)}")


def _files(path: Path, quants: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(quantization, file) for each --quant: the file itself for its own type, else the file
    quantized into the cache."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.deciding.fit import file_type
    from llamacpp_instr.running.quant.quantize import TYPES
    from llamacpp_instr.running.quant.sweep import quantized

    own = file_type(path)
    asked = [q.lower() for q in quants] or [own]
    for q in asked:
        if q not in TYPES and q != own:
            raise UserError(f"unknown --quant {q!r}: choose one of {', '.join(TYPES)}")
    out = []
    for q in dict.fromkeys(asked):
        if q == own:
            out.append((q, path))
        else:
            out.append((q, quantized(path, q, 0, lambda s: click.echo(s, err=True))))
    return out


def _fit_params_program(required: bool) -> Path | None:
    """llama-fit-params of the current patches: required with --compare-llama (a one-line error
    naming the build command if missing), else used when it is built."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.native import tools

    try:
        return tools.find("llama-fit-params")
    except UserError:
        if required:
            raise
        return None


def render(a: Answer) -> str:
    """One quantization's answer as text: the setting, then a table per device and purpose."""
    from llamacpp_instr.contract.units import fmt_bytes

    head = f"{a.model.name} ({a.quant})"
    lines = []
    if a.setting is None:
        over = ", ".join(a.overflow)
        lines.append(f"{head}: does not fit, not even --ctx 256 with a q8_0 KV cache ({over})")
    else:
        s = a.setting
        kv = f"{s.type_k} KV cache" + (" with flash attention" if s.flash_attn else "")
        layers = f", {s.n_gpu_layers} of {a.n_layer + 1} layers offloaded" if a.gpu else ""
        lines.append(f"{head}: fits --ctx {s.n_ctx} (n_ctx_train {a.n_ctx_train}){layers}, {kv}")
        lines.append(f"  instr run {a.model} " + " ".join(s.run_args(a.gpu)))
    rows = _rows(a)
    purposes = [p for p in PURPOSES if any(p in r[2] for r in rows)]
    purposes += sorted({p for r in rows for p in r[2]} - set(purposes))
    header = ["device", "memory", "source", *purposes, "total"]
    table = [header]
    for dev, source, fp in rows:
        limit = fmt_bytes(a.memory[dev]) if dev in a.memory and source == "instr fit" else ""
        table.append(
            [dev, limit, source]
            + [fmt_bytes(fp[p], "MiB") if p in fp else "-" for p in purposes]
            + [fmt_bytes(sum(fp.values()), "MiB")]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        cells = [
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    lines.append("  (llama-fit-params rounds each figure down to a MiB)" if a.llama_fit else "")
    return "\n".join(x for x in lines if x) + "\n"


def _rows(a: Answer) -> list[tuple[str, str, dict[str, int]]]:
    """(device, source, {purpose: bytes}) in device order: instr fit's projection, then
    llama-fit-params' and the measured use where there are."""
    sources: list[tuple[str, Footprint]] = [("instr fit", a.footprint)]
    if a.llama_fit is not None:
        in_bytes = {d: {p: v << 20 for p, v in fp.items()} for d, fp in a.llama_fit.items()}
        sources.append(("llama-fit-params", in_bytes))
    if a.measured is not None:
        sources.append(("measured", a.measured))
    devs = list(dict.fromkeys(d for _, fp in sources for d in fp))
    return [(d, name, fp[d]) for d in devs for name, fp in sources if d in fp]
