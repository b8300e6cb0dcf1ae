"""One of llama.cpp's own programs run with a session open (``instr exec``): the program found in
the tools' cache, its log chosen (an existing one kept as LOG.old), its environment set from the
options alone, the metrics exporter started beside it, and an allocation failure its log recorded
said as ``instr run`` says it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.always_on import AlwaysOn

# what the environment may hold from before: only the options say these
_OPTIONS_ONLY = (
    "LLAMA_INSTR_SAMPLE",
    "LLAMA_INSTR_SAMPLE_REQUESTS",
    "LLAMA_INSTR_MAX_BYTES",
    "LLAMA_INSTR_KEEP",
    "LLAMA_INSTR_MEMORY_BUDGET",
    "LLAMA_INSTR_BODIES",
)


@dataclass(frozen=True)
class ExecRequest:
    """Run ``program`` (as ``instr build --tools`` built it; with ``vulkan``, its Vulkan build) with
    ``args``, writing the session log ``output`` (default: $LLAMA_INSTR_LOG, added to, else
    PROGRAM_YYYYMMDD_HHMMSS.log) at ``level``; ``metrics``: serve the log's figures at HOST:PORT
    from a process beside it; ``bodies``: llama-server's request records keep each request's body
    and generated tokens at DETAILED and above (what ``instr replay`` sends again)."""

    program: str
    args: tuple[str, ...] = ()
    output: Path | None = None
    append: bool = False
    level: str = "detailed"
    always_on: AlwaysOn = field(default_factory=AlwaysOn)
    top_k_logits: int = 10  # instr exec's default: LLAMA_INSTR_TOPK takes 1 to 1000
    value_stats: bool = False
    memory_budget: str | None = None
    metrics: str | None = None
    vulkan: bool = False
    sanitize: str | None = None  # llama-server's sanitized build (`instr build --tools --sanitize`)
    bodies: bool = True


def run_program(request: ExecRequest, say: Callable[[str], None] = lambda _: None) -> int:
    """Run the program to its end and return its exit status (negative: the signal that ended
    it); ``say`` hears where the log is and what it holds. A program that failed on an allocation
    its log recorded raises ``OutOfMemory`` (exit status 3)."""
    from llamacpp_instr.native import build_plan, tools
    from llamacpp_instr.running import child
    from llamacpp_instr.running import memory_budget as memory

    extra = build_plan.VULKAN_CMAKE_ARGS if request.vulkan else ()
    exe = tools.find_logged(request.program, extra, request.sanitize)
    out = session_log(request, say)
    if request.metrics is not None:
        from llamacpp_instr.running import exporter_launch as launch

        launch.start_beside(out, request.metrics)  # it ends once this process has
    more = request.always_on.describe()
    say(f"instr exec: session log {out} (level {request.level}{'; ' + more if more else ''})")
    since = memory.mark_log(out)
    try:
        returncode = child.run(exe, [request.program, *request.args], environment(request, out))
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
            setting = memory.program_setting(request.program, list(request.args), context)
            raise memory.OutOfMemory(memory.message(failure, setting))
    return returncode


def session_log(request: ExecRequest, say: Callable[[str], None]) -> Path:
    """The log to write: -o, else an inherited LLAMA_INSTR_LOG, else one named for the program
    and the time; a log already there and not added to is kept as LOG.old."""
    from llamacpp_instr.running.runner import check_writable, keep_old

    inherited = os.environ.get("LLAMA_INSTR_LOG")
    out = request.output
    if out is not None and inherited:
        say(f"instr exec: -o {out} replaces LLAMA_INSTR_LOG={inherited}")
    elif inherited:
        out = Path(inherited)
    elif out is None:
        out = Path(f"{request.program}_{time.strftime('%Y%m%d_%H%M%S')}.log")
    check_writable(out)
    # -o: this run's log alone
    if old := keep_old(out, request.append or request.output is None):
        say(f"instr exec: the log that was at {out} is {old} (--append adds)")
    return out


def environment(request: ExecRequest, out: Path) -> dict[str, str]:
    """The program's environment: this process's, with the session's settings from the options
    alone."""
    env = {k: v for k, v in os.environ.items() if k not in _OPTIONS_ONLY}
    env["LLAMA_INSTR_LOG"] = str(out.resolve())
    env["LLAMA_INSTR_LEVEL"] = request.level
    env["LLAMA_INSTR_TOPK"] = str(request.top_k_logits)
    env["LLAMA_INSTR_VALUE_STATS"] = "1" if request.value_stats else "0"
    if not request.bodies:
        env["LLAMA_INSTR_BODIES"] = "0"
    env.update(request.always_on.env())
    if request.memory_budget:  # the option's (which reads it too), in bytes
        env["LLAMA_INSTR_MEMORY_BUDGET"] = request.memory_budget
    return env
