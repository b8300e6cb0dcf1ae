"""``instr tools``: where llama.cpp's own programs of the current patches are (``instr build --tools``)."""

from __future__ import annotations

import click

from llamacpp_instr.cli_shared.output import answer


@click.command("tools", hidden=True)
@click.option(
    "--vulkan",
    is_flag=True,
    help="The programs built with ggml's Vulkan backend (--tools --vulkan).",
)
def command(vulkan: bool) -> None:
    """The old name of `instr doctor --tools`.

    Print where llama-server, llama-cli, llama-bench, llama-perplexity, ggml-rpc-server and
    llama-fit-params are.

    They are built from the same patched llama.cpp as the wheel by `instr build --tools` and cached
    under ~/.cache/llamacpp-instr/tools/ (keyed like the wheel). Run one with a session open with
    `instr exec PROGRAM ARGS...`, or set LLAMA_INSTR_LOG yourself. ggml-rpc-server (ggml's RPC
    server, for a client's `--rpc HOST:PORT`) writes no log: it times the graphs it computes and
    sends the times to a patched client, whose log holds them. llama-fit-params (llama.cpp's own
    memory projection) is what `instr fit --compare-llama` shows beside its own.
    """
    from llamacpp_instr.running import checkup

    answer(checkup.programs_report(checkup.programs(vulkan)), "text")
