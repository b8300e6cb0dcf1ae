"""``instr doctor``: which llama_cpp is installed, is it our patched build of these patches, and
which devices can its ggml run on? (``llamacpp_instr.running.checkup``)"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from llamacpp_instr.commands.offload_options import offload_options
from llamacpp_instr.commands.output import answer

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("doctor")
@offload_options(layers=False, device=False, split=False)
def command(offload: Offload) -> None:
    """Report the installed llama-cpp-python: stock or patched, and whether its patch hash matches
    the patches shipped with this llamacpp-instr (exit status 2 when the hooks are missing or out
    of date); the backends the build has (CUDA, Vulkan, ...: their libraries, whether or not a
    device of theirs is here); then ggml's devices, the names --device takes: name, backend, type (cpu, gpu, igpu,
    accel, other) and memory, as a session records them in session_start.machine.devices. --rpc
    adds RPC servers first, as a run would."""
    from llamacpp_instr.running import checkup

    found = checkup.check(offload.rpc)
    answer(checkup.report(found), "text", found.failure())
