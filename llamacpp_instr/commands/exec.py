"""``instr exec``: run one of llama.cpp's own programs with a session open (LLAMA_INSTR_LOG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.always_on_options import always_on_options
from llamacpp_instr.cli_shared.options import (
    append_option,
    level_option,
    memory_budget_option,
    metrics_option,
    output_option,
    topk_option,
    value_stats_option,
)

if TYPE_CHECKING:
    from llamacpp_instr.running.always_on import AlwaysOn


@click.command(
    "exec",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@output_option(
    "Session log to write: an existing one is replaced, kept as LOG.old (--append adds to it). "
    "Default: $LLAMA_INSTR_LOG if set (added to), else PROGRAM_YYYYMMDD_HHMMSS.log."
)
@append_option
@level_option
@always_on_options()
@topk_option
@value_stats_option
@memory_budget_option
@metrics_option
@click.option(
    "--vulkan",
    is_flag=True,
    help="Run the program as built with ggml's Vulkan backend (`instr build --tools --vulkan`).",
)
@click.option(
    "--sanitize",
    type=click.Choice(["address", "thread"]),
    default=None,
    help="Run llama-server as built with a sanitizer (`instr build --tools --sanitize=KIND`).",
)
@click.option(
    "--no-bodies",
    "no_bodies",
    is_flag=True,
    help="llama-server's request records without each request's body and generated tokens "
    "(kept at detailed and above, images as their hash and size: what `instr replay` sends again).",
)
@click.argument("program")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(
    output: Path | None,
    append: bool,
    level: str,
    always_on: AlwaysOn,
    top_k_logits: int,
    value_stats: bool,
    memory_budget: str | None,
    metrics: str | None,
    vulkan: bool,
    sanitize: str | None,
    no_bodies: bool,
    program: str,
    args: tuple[str, ...],
) -> None:
    """Run PROGRAM (llama-server, llama-cli, llama-bench, llama-perplexity or llama-mtmd-cli, as
    built by `instr build --tools`) with ARGS, writing a session log for its whole life.

    The program runs as this command's child: its output, exit status and signals are its own
    (a signal sent to instr is passed on to it; Ctrl-C at the terminal reaches it directly). The
    session opens at its first context and ends when it exits (`ok`; `error` when it exits with
    a failure status), or `interrupted` after SIGINT/SIGTERM, which the program handles as it
    always does (llama-server shuts down on Ctrl-C); SIGHUP reopens the log (logrotate); SIGUSR1
    switches the level to minimal and back. llama-server writes a `request` record per request,
    llama-bench a `part` record per test. When the program fails on an allocation its log
    recorded (out of memory, or beyond --memory-budget), instr ends with the one line `instr run`
    gives, what failed and what would free how much, and exit status 3 (the log is opened at the
    first context: a failure before it, with llama.cpp's --fit off, leaves no log). Options for instr go
    before PROGRAM, everything after it is the program's, untouched (-ot, --n-cpu-moe... as
    llama.cpp reads them):

        instr exec -o server.log llama-server -m model.gguf --port 8080 --parallel 2
        instr exec --sample 16 --max-bytes 64M --keep 8 -o server.log llama-server -m model.gguf
        instr exec --metrics 127.0.0.1:9400 -o server.log llama-server -m model.gguf
        instr exec -o moe.log llama-server -m moe.gguf -ngl 99 --n-cpu-moe 2 -ot 'exps=CPU'

    A LLAMA_INSTR_LOG already set in the environment is where the log goes unless -o says
    otherwise (-o wins, and says so); the level, top-k logits, value statistics, sampling and
    rotation are always the options' own.
    """
    from llamacpp_instr.running import child
    from llamacpp_instr.running.exec_program import ExecRequest, run_program

    request = ExecRequest(
        program=program,
        args=args,
        output=output,
        append=append,
        level=level,
        always_on=always_on,
        top_k_logits=top_k_logits,
        value_stats=value_stats,
        memory_budget=memory_budget,
        metrics=metrics,
        vulkan=vulkan,
        sanitize=sanitize,
        bodies=not no_bodies,
    )
    child.end_like(run_program(request, say=lambda line: click.echo(line, err=True)))
