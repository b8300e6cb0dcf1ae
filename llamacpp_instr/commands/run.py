"""``instr run``: generate with a real model while the native instrumentation writes a session log."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from llamacpp_instr.cli_shared import options, run_options
from llamacpp_instr.cli_shared.always_on_options import always_on_options
from llamacpp_instr.cli_shared.deprecated import out_alias
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.tensor_options import tensor_options


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
# every option but these three is a field of runner.RunConfig, by the same name
def command(model: Path | None, output: Path | None, live: bool, **settings: Any) -> None:
    """Run MODEL.gguf (default: the bundled SmolLM2-135M-Instruct) on a prompt with instrumentation.

    The prompt comes from -p TEXT, -p - (stdin) or --prompt-file FILE; --chat formats it with the
    model's chat template (with --system as the system message).

    Prints the generated text on stdout and, on stderr, where the session log is and what it holds.
    Ctrl-C ends the session with status `interrupted`; the log stays valid.
    """
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner

    cfg = runner.RunConfig(
        model=model if model is not None else models.default_model(), out=output, **settings
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
