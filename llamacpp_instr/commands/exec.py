"""``instr exec``: run one of llama.cpp's own programs with a session open (LLAMA_INSTR_LOG)."""

from __future__ import annotations

import os
import time
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
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.native import build, tools
    from llamacpp_instr.running import child
    from llamacpp_instr.running import memory_budget as memory
    from llamacpp_instr.running.runner import check_writable, keep_old

    if program == "llama-fit-params":
        raise click.UsageError(
            "llama-fit-params writes no log (it projects memory and runs no model): "
            "`instr fit --compare-llama` runs it beside instr fit's own projection"
        )
    if program in tools.PROGRAMS and program not in tools.LOGGED_PROGRAMS:
        raise click.UsageError(
            f"{program} writes no log (it does not run libllama): start it as it is (`instr doctor --tools` "
            "says where); the log of the client that uses it holds its times"
        )
    exe = tools.find(program, build.VULKAN_CMAKE_ARGS if vulkan else ())
    inherited = os.environ.get("LLAMA_INSTR_LOG")
    out = output
    if out is not None and inherited:
        click.echo(f"instr exec: -o {out} replaces LLAMA_INSTR_LOG={inherited}", err=True)
    elif inherited:
        out = Path(inherited)
    elif out is None:
        out = Path(f"{program}_{time.strftime('%Y%m%d_%H%M%S')}.log")
    check_writable(out)
    if old := keep_old(out, append or output is None):  # -o: this run's log alone
        click.echo(f"instr exec: the log that was at {out} is {old} (--append adds)", err=True)
    env = dict(os.environ)
    env["LLAMA_INSTR_LOG"] = str(out.resolve())
    env["LLAMA_INSTR_LEVEL"] = level
    env["LLAMA_INSTR_TOPK"] = str(top_k_logits)
    env["LLAMA_INSTR_VALUE_STATS"] = "1" if value_stats else "0"
    for name in ("LLAMA_INSTR_SAMPLE", "LLAMA_INSTR_SAMPLE_REQUESTS", "LLAMA_INSTR_MAX_BYTES"):
        env.pop(name, None)  # only what the options say
    env.pop("LLAMA_INSTR_KEEP", None)
    env.update(always_on.env())
    env.pop("LLAMA_INSTR_MEMORY_BUDGET", None)  # the option's (which reads it too), in bytes
    if memory_budget:
        env["LLAMA_INSTR_MEMORY_BUDGET"] = memory_budget
    more = always_on.describe()
    if metrics is not None:
        from llamacpp_instr.running import exporter_launch as launch

        launch.start_beside(out, metrics)  # it ends once this process has, and the log is read
    click.echo(
        f"instr exec: session log {out} (level {level}{'; ' + more if more else ''})", err=True
    )
    since = memory.mark_log(out)
    try:
        returncode = child.run(exe, [program, *args], env)
    except OSError as exc:
        raise UserError(f"cannot run {exe}: {exc.strerror or exc}") from None
    # a program that ended on its own with a failure (not one the user stopped with a signal it
    # was passed, nor one that recovered and exited 0) and an allocation failure in its log: that
    # allocation is why, said as `instr run` says it
    stopped = returncode < 0 and -returncode in child.FORWARDED
    if returncode != 0 and not stopped:
        found = memory.failure_in_log(out, since)
        if found is not None:
            failure, context = found
            setting = memory.program_setting(program, list(args), context)
            raise memory.OutOfMemory(memory.message(failure, setting))
    child.end_like(returncode)
