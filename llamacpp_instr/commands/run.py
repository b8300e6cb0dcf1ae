"""``instr run``: generate with a real model while the native instrumentation writes a session log."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.commands.always_on_options import always_on_options
from llamacpp_instr.commands.deprecated import out_alias
from llamacpp_instr.commands.offload_options import offload_options
from llamacpp_instr.commands.options import (
    ctx_option,
    kv_type_options,
    level_option,
    log_option,
    memory_budget_option,
    threads_option,
    topk_option,
)
from llamacpp_instr.commands.tensor_options import tensor_options

if TYPE_CHECKING:
    from llamacpp_instr.running.always_on import AlwaysOn
    from llamacpp_instr.running.offload import Offload
    from llamacpp_instr.running.runner import RunConfig, RunResult
    from llamacpp_instr.running.tensor_overrides import TensorOverrides


@click.command("run")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option("-p", "--prompt", default=None, help="Prompt text; - reads it from stdin.")
@click.option(
    "--prompt-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Read the prompt from this file (UTF-8).",
)
@click.option(
    "--chat",
    is_flag=True,
    help="Format the prompt with the model's own chat template (its GGUF's "
    "tokenizer.chat_template) as a user message.",
)
@click.option("--system", default=None, help="A system message, with --chat.")
@click.option(
    "-n",
    "--n-predict",
    type=click.IntRange(min=0),
    default=32,
    show_default=True,
    help="Tokens to generate.",
)
@threads_option
@offload_options()
@tensor_options
@memory_budget_option
@ctx_option
@click.option(
    "--batch",
    "n_batch",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per llama_decode call.",
)
@click.option(
    "--ubatch",
    "n_ubatch",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per graph compute (default: --batch).",
)
@level_option
@always_on_options(requests=False)
@log_option
@out_alias
@click.option("--seed", default=0, show_default=True, help="Sampling seed.")
@click.option(
    "--temp",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Sampling temperature (0 = greedy).",
)
@click.option(
    "--flash-attn/--no-flash-attn",
    default=False,
    show_default=True,
    help="Fused flash attention instead of separate KQ / soft_max / KQV ops.",
)
@kv_type_options
@topk_option
@click.option(
    "--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence (fixed-length runs)."
)
@click.option(
    "--live",
    is_flag=True,
    help="Show the live view of instr follow while generating (the text is printed at the end).",
)
def command(
    model: Path | None,
    prompt: str | None,
    prompt_file: Path | None,
    chat: bool,
    system: str | None,
    n_predict: int,
    threads: int | None,
    offload: Offload,
    tensors: TensorOverrides,
    memory_budget: str | None,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int | None,
    level: str,
    always_on: AlwaysOn,
    output: Path | None,
    seed: int,
    temp: float,
    flash_attn: bool,
    type_k: str,
    type_v: str,
    top_k_logits: int,
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

    text = read_prompt(prompt, prompt_file)
    cfg = runner.RunConfig(
        model=model if model is not None else models.default_model(),
        prompt=text,
        chat=chat,
        system=system,
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
        type_k=type_k,
        type_v=type_v,
        top_k_logits=top_k_logits,
        ignore_eos=ignore_eos,
        always_on=always_on,
    )
    if live:
        result = _run_live(cfg)
    else:
        result = runner.run(cfg, on_text=runner.echo_stream)
    sys.stdout.write("\n")
    click.echo(
        f"session log: {result.log_path} ({result.n_steps} steps, {result.n_tokens} tokens decoded: "
        f"{result.n_prompt_tokens} prompt + {result.n_generated} generated; status {result.status})",
        err=True,
    )
    if result.status == "interrupted":
        sys.exit(130)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from exactly one of -p TEXT, -p - (stdin) and --prompt-file."""
    from llamacpp_instr.contract.errors import UserError

    if (prompt is None) == (prompt_file is None):
        raise UserError("give the prompt with exactly one of -p/--prompt and --prompt-file")
    if prompt_file is not None:
        try:
            text = prompt_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"prompt file not found: {prompt_file}") from None
        except UnicodeDecodeError:
            raise UserError(f"prompt file is not UTF-8 text: {prompt_file}") from None
        except OSError as exc:
            raise UserError(f"cannot read prompt file {prompt_file}: {exc.strerror}") from None
    elif prompt == "-":
        text = sys.stdin.read()  # (click 8.5 deprecates get_text_stream)
    else:
        text = prompt or ""
    if not text.strip():
        raise UserError("the prompt is empty")
    return text


def _run_live(cfg: RunConfig) -> RunResult:
    """Generate while a second thread follows the log as ``instr follow`` does."""
    import threading

    from llamacpp_instr.commands.follow import follow
    from llamacpp_instr.running import runner

    cfg.validate()
    if cfg.out is None:
        cfg.out = runner.default_log_name()
    if cfg.out.exists() and cfg.out.stat().st_size > 0:
        # the view follows the file from its start: an earlier session in it would be shown
        from llamacpp_instr.contract.errors import UserError

        raise UserError(f"--live needs a new log file; {cfg.out} exists")
    stop = threading.Event()
    viewer = threading.Thread(target=follow, args=(cfg.out, 600.0, stop), daemon=True)
    viewer.start()
    try:
        result = runner.run(cfg)
    finally:
        stop.set()
        viewer.join(timeout=5)
    sys.stdout.write(result.text)
    return result
