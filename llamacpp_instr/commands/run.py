"""``instr run``: generate with a real model while the native instrumentation writes a session log."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared import options, run_options
from llamacpp_instr.cli_shared.always_on_options import always_on_options
from llamacpp_instr.cli_shared.deprecated import out_alias
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.tensor_options import tensor_options

if TYPE_CHECKING:
    from llamacpp_instr.running.always_on import AlwaysOn
    from llamacpp_instr.running.media import MediaInputs
    from llamacpp_instr.running.offload import Offload
    from llamacpp_instr.running.tensor_overrides import TensorOverrides


@click.command("run")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@run_options.prompt_options
@run_options.media_options
@run_options.generation_options
@options.threads_option
@offload_options()
@tensor_options
@options.memory_budget_option
@options.ctx_option
@run_options.graph_options
@options.warmup_option
@options.level_option
@always_on_options(requests=False)
@options.log_option
@options.append_option
@out_alias
@options.kv_type_options
@options.topk_option
@options.value_stats_option
@click.option(
    "--live",
    is_flag=True,
    help="Show the live view of instr follow while generating (the text is printed at the end).",
)
def command(
    model: Path | None,
    prompt: str,
    chat: bool,
    system: str | None,
    media: MediaInputs,
    n_predict: int,
    threads: int | None,
    offload: Offload,
    tensors: TensorOverrides,
    memory_budget: str | None,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int,
    level: str,
    always_on: AlwaysOn,
    output: Path | None,
    append: bool,
    seed: int,
    temp: float,
    flash_attn: bool | None,
    warmup: bool,
    type_k: str,
    type_v: str,
    top_k_logits: int,
    value_stats: bool,
    ignore_eos: bool,
    live: bool,
) -> None:
    """Run MODEL.gguf (default: the bundled SmolLM2-135M-Instruct) on a prompt with instrumentation.

    The prompt comes from -p TEXT, -p - (stdin) or --prompt-file FILE; --chat formats it with the
    model's chat template (with --system as the system message).

    Prints the generated text on stdout and, on stderr, where the session log is and what it holds.
    Ctrl-C ends the session with status `interrupted`; the log stays valid.
    """
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner

    cfg = runner.RunConfig(
        model=model if model is not None else models.default_model(),
        prompt=prompt,
        chat=chat,
        system=system,
        media=media,
        n_predict=n_predict,
        threads=threads,
        offload=offload,
        tensors=tensors,
        memory_budget=memory_budget,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        level=level,
        out=output,
        seed=seed,
        temp=temp,
        flash_attn=flash_attn,
        warmup=warmup,
        type_k=type_k,
        type_v=type_v,
        top_k_logits=top_k_logits,
        value_stats=value_stats,
        ignore_eos=ignore_eos,
        always_on=always_on,
        append=append,
    )
    if live:  # the live view of instr follow while generating, the text at the end
        from llamacpp_instr.converters.reports.renderers.live import follow

        result = runner.run_watched(cfg, follow)
        sys.stdout.write(result.text)
    else:
        result = runner.run(cfg, on_text=runner.echo_stream)
    sys.stdout.write("\n")
    # the last token generated is not fed back (decoded) unless end-of-sequence followed it
    fed = result.n_tokens - result.n_prompt_tokens
    gen = (
        f"{fed} generated"
        if fed == result.n_generated
        else f"{fed} of the {result.n_generated} generated"
    )
    click.echo(
        f"session log: {result.log_path} ({result.n_steps} steps, {result.n_tokens} tokens decoded: "
        f"{result.n_prompt_tokens} prompt + {gen}; status {result.status})",
        err=True,
    )
    if result.old_log:
        click.echo(f"the log that was there is {result.old_log} (--append adds to it)", err=True)
    if result.status == "interrupted":
        sys.exit(130)
