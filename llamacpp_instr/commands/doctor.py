"""``instr doctor``: which llama_cpp is installed, is it our patched build of these patches, and
which devices can its ggml run on? (``llamacpp_instr.running.checkup``); where llama.cpp's own
programs are (``--tools``); a run of the bundled model that checks itself (``--demo``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.deprecated import out_dir_alias
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import output_type
from llamacpp_instr.cli_shared.output import answer

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("doctor")
@offload_options(layers=False, device=False, split=False)
@click.option(
    "--tools",
    "with_tools",  # as build's --tools: llama.cpp's own programs
    is_flag=True,
    help="Where llama.cpp's own programs (instr build --tools) are, instead.",
)
@click.option("--vulkan", is_flag=True, help="With --tools: the programs built for Vulkan.")
@click.option(
    "--demo",
    is_flag=True,
    help="Run the bundled model, convert its log to a trace and check both, instead.",
)
@click.option(
    "-o",
    "--output",
    type=output_type(True),
    help="With --demo: directory for demo.log and demo.pftrace (default: here).",
)
@out_dir_alias
@click.option("-n", "--n-predict", type=int, help="With --demo: tokens to generate (16).")
def command(
    offload: Offload,
    with_tools: bool,
    vulkan: bool,
    demo: bool,
    output: Path | None,
    n_predict: int | None,
) -> None:
    """Report the installed llama-cpp-python: stock or patched, and whether its patch hash matches
    the patches shipped with this llamacpp-instr (exit status 2 when the hooks are missing or out
    of date); the backends the build has (CUDA, Vulkan, ...: their libraries, whether or not a
    device of theirs is here); then ggml's devices, the names --device takes: name, backend, type
    (cpu, gpu, igpu, accel, other) and memory, as a session records them in
    session_start.machine.devices. --rpc adds RPC servers first, as a run would.

    --tools prints where llama-server, llama-cli, llama-bench, llama-perplexity, ggml-rpc-server
    and llama-fit-params are: built from the same patched llama.cpp as the wheel by `instr build
    --tools` and cached under ~/.cache/llamacpp-instr/tools/ (keyed like the wheel). Run one with a
    session open with `instr exec PROGRAM ARGS...`.

    --demo runs the bundled SmolLM2-135M at the detailed level, converts the log to a Perfetto
    trace, and checks both: every log line parses, the session ended ok, every generated token's
    step holds per-op timings, and the trace was written. Exit status 2 if anything is off."""
    if with_tools and demo:
        raise click.UsageError("--tools and --demo go one at a time")
    if vulkan and not with_tools:
        raise click.UsageError("--vulkan goes with --tools")
    if (output is not None or n_predict is not None) and not demo:
        raise click.UsageError("-o/--output and -n/--n-predict go with --demo")
    from llamacpp_instr.running import checkup

    if with_tools:
        answer(checkup.programs_report(checkup.programs(vulkan)), "text")
    elif demo:
        from llamacpp_instr.running import runner
        from llamacpp_instr.running.self_check import SelfCheck, self_check

        request = SelfCheck(output or Path("."), 16 if n_predict is None else n_predict)
        checked = self_check(request, on_text=runner.echo_stream)
        click.echo("")
        click.echo(checked.log_line())
        for line in checked.conversion:
            click.echo(line, err=True)
        click.echo(checked.trace_line())
    else:
        found = checkup.check(offload.rpc)
        answer(checkup.report(found), "text", found.failure())
