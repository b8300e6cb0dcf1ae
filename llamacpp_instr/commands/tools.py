"""``instr tools``: where llama.cpp's own programs of the current patches are (``instr build --tools``)."""

from __future__ import annotations

import click


@click.command("tools")
def command() -> None:
    """Print where llama-server, llama-cli, llama-bench and llama-perplexity are.

    They are built from the same patched llama.cpp as the wheel by `instr build --tools` and cached
    under ~/.cache/llamacpp-instr/tools/ (keyed like the wheel). Run one with a session open with
    `instr exec PROGRAM ARGS...`, or set LLAMA_INSTR_LOG yourself.
    """
    from llamacpp_instr import tools

    folder = tools.bin_dir(tools.tools_plan())
    for program in tools.PROGRAMS:
        exe = folder / program
        where = str(exe) if exe.is_file() else f"not built (run `{tools.BUILD_COMMAND}`)"
        click.echo(f"{program:<18}{where}")
