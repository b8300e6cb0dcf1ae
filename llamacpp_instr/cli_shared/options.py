"""The options more than one command takes, each defined once (one name, one meaning).

The options of where a model's layers run are in ``offload_options``, those that bound a long
session in ``always_on_options``, the old spellings kept for one release in ``deprecated``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import SESSION_LEVELS

F = TypeVar("F", bound=Callable[..., Any])

# One name, one meaning, one definition: every option more than one command takes is defined here.
#   -o/--output    where the command writes (a report, trace, session log, GGUF, or export directory)
#   --session      a session id, when a log holds several
#   -t/--threads   CPU threads (default: all cores, at most 8: runner.resolve_threads; predict:
#                  its first log's, ``threads_option_with``)
#   --ctx          the context size in tokens (run, serve); quant-eval's chunks are --chunk-size
#   --top          rows per table in text and markdown
#   --strict       refuse a damaged log instead of skipping its bad lines
#   --peaks        an `instr peaks` file (default: the cached peaks of the log's machine)
#   --metrics      HOST:PORT of an `instr follow --prometheus` exporter beside the program (exec, serve)
#   --sample, --sample-requests, --max-bytes, --keep   always on (run, serve, exec):
#                  ``always_on_options``, given to the command as one ``always_on``
#   -ngl/--gpu-layers, --device, --rpc, --tensor-split   where a model's layers run (offload.py)
#   -ctk/--cache-type-k, -ctv/--cache-type-v   the KV cache's types (llama.cpp's names; run, fit,
#                  quant-eval)
#   --quant        the model quantized to TYPE (fit, plan, predict: ``quant_option``)
#   --format       text or json (fit, plan, predict: ``text_json_option``); report formats
#                  (summary, compare, ...: ``report_options``)
# Old spellings keep working for one release through ``deprecated_alias``, with a note on stderr.

session_option = click.option(
    "--session",
    "sid",
    default=None,
    help="Session id, when the log holds several (default: the latest; the command names the "
    "others on stderr).",
)

# shared by the commands that run a model with a session open (instr run, instr serve)
level_option = click.option(
    "--level",
    type=click.Choice(SESSION_LEVELS),
    default="detailed",
    show_default=True,
    help="minimal: steps + layer spans; detailed: + per-op timings and graph tables; "
    "verbose: + per-thread times and top-k logits (and value statistics with --value-stats).",
)
# what a device may hold, for the commands that size a setting (fit, plan)
memory_option = click.option(
    "--memory",
    "memory_specs",
    metavar="DEVICE=SIZE",
    multiple=True,
    help="What a device may hold, e.g. CPU=2G or Vulkan0=6G (K, M, G: powers of 1024; "
    "repeatable). Default: each device's free memory as ggml reports it (a memory budget, "
    "LLAMA_INSTR_MEMORY_BUDGET, lowers it).",
)


def quant_option(help: str) -> Callable[[F], F]:
    """``--quant TYPE``, repeatable: the model quantized to TYPE (into the cache, by the pinned
    llama.cpp's quantizer, as instr quantize does), for the commands that size or price a setting
    (fit, plan, predict); ``help`` says what each does with it."""
    return click.option("--quant", "quants", metavar="TYPE", multiple=True, help=help)


def text_json_option(help: str) -> Callable[[F], F]:
    """``--format text|json`` of the planners' commands (fit, plan, predict): their report as
    text, or their answer as JSON (the report commands take ``report_options``: every format,
    and -o/--output)."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help=help,
    )


ctx_option = click.option(
    "--ctx",
    "n_ctx",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Context size in tokens.",
)


def threads_option_with(default: str) -> Callable[[F], F]:
    """-t/--threads, its default said in words (one help everywhere: ``threads_option``'s is
    runner.resolve_threads'; predict's is its first log's)."""
    return click.option(
        "-t",
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        show_default=default,
        help="CPU threads.",
    )


threads_option = threads_option_with("all cores, at most 8")
warmup_option = click.option(
    "--warmup/--no-warmup",
    default=True,
    show_default=True,
    help="Before the session, decode the BOS and EOS tokens once and forget them, as llama.cpp's "
    "programs do: the weights are read and a GPU's kernels loaded before the first step, which "
    "--no-warmup leaves to it.",
)
topk_option = click.option(
    "--top-k-logits",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Logits kept per token at verbose.",
)
value_stats_option = click.option(
    "--value-stats",
    is_flag=True,
    help="At verbose, also each CPU op's output statistics (min, max, mean, std, NaN and "
    "infinity counts: tensor_stats records). The threads read every output again, much of it "
    "written by another core: this costs more than the rest of verbose together.",
)
# instr exec, instr serve: an `instr follow --prometheus` exporter beside the program (running/exporter_launch.py)
metrics_option = click.option(
    "--metrics",
    metavar="HOST:PORT",
    default=None,
    help="Serve the log's figures to Prometheus at http://HOST:PORT/metrics from a process of its "
    "own beside the program (`instr follow --prometheus`).",
)
top_option = click.option(
    "--top",
    type=click.IntRange(min=0),
    default=12,
    show_default=True,
    help="Rows per table in text and markdown (0 = all).",
)
strict_option = click.option(
    "--strict", is_flag=True, help="Fail on the first damaged line instead of skipping it."
)
# the roofs ops are set against (summary, to-perfetto)
peaks_option = click.option(
    "--peaks",
    "peaks_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Peaks file of `instr peaks` (default: the cached peaks of the machine that made the "
    "log); refused if measured on another machine.",
)


class SizeParam(click.ParamType):
    """A size in bytes, with an optional K, M or G suffix: 64M."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from llamacpp_instr.running.always_on import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except UserError as exc:
            self.fail(str(exc), param, ctx)


class BudgetParam(click.ParamType):
    """A memory budget, DEVICE=SIZE[,DEVICE=SIZE...] (``llamacpp_instr.running.memory_budget``), as the bytes
    spec the patched library reads."""

    name = "DEVICE=SIZE[,...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from llamacpp_instr.running import memory_budget as memory

        try:
            return memory.format_budget(memory.parse_budget(str(value)))
        except UserError as exc:
            self.fail(str(exc), param, ctx)


def memory_budget_option(f: F) -> F:
    """``--memory-budget DEVICE=SIZE[,...]`` (or LLAMA_INSTR_MEMORY_BUDGET): each device named
    behaves as if it had only that much memory."""
    return click.option(
        "--memory-budget",
        type=BudgetParam(),
        default=None,
        envvar="LLAMA_INSTR_MEMORY_BUDGET",
        show_envvar=True,
        help="Make devices behave as if they had only this much memory, e.g. CPU=2G,Vulkan0=512M "
        "(K, M, G: powers of 1024): a buffer beyond it fails as out of memory, and llama.cpp's "
        "own memory query reports the budget.",
    )(f)


def kv_type_options(f: F) -> F:
    """``-ctk/--cache-type-k`` and ``-ctv/--cache-type-v``: the KV cache's types, as llama.cpp
    names them (a quantized V cache needs flash attention)."""
    from llamacpp_instr.running.memory_budget import KV_TYPES

    for short, long, dest, what in (
        ("-ctv", "--cache-type-v", "type_v", "V"),
        ("-ctk", "--cache-type-k", "type_k", "K"),
    ):
        f = click.option(
            short,
            long,
            dest,
            type=click.Choice(KV_TYPES),
            default="f16",
            show_default=True,
            help=f"The KV cache's {what} type"
            + (" (a quantized one needs --flash-attn)." if what == "V" else "."),
        )(f)
    return f


def output_option(
    help: str, *, directory: bool = False, required: bool = False, default: Path | None = None
) -> Callable[[F], F]:
    """``-o/--output``: where the command writes; ``help`` says what (a file, or a directory)."""
    return click.option(
        "-o",
        "--output",
        type=output_type(directory),
        default=default,
        show_default=default is not None,
        required=required,
        help=help,
    )


def output_type(directory: bool = False) -> click.Path:
    """The value of -o/--output (and of its old spellings): a file, or a directory."""
    if directory:
        return click.Path(path_type=Path, file_okay=False)
    return click.Path(path_type=Path, dir_okay=False)


# the session log of the commands that run a model (instr run, instr serve)
log_option = output_option(
    "Session log path (default: llama_instrumentation_YYYYMMDD_HHMMSS.log here). An existing "
    "log there is replaced, kept beside it as LOG.old (as perf record keeps perf.data.old)."
)
# ... and to keep what is there (instr run, instr serve, instr exec)
append_option = click.option(
    "--append",
    is_flag=True,
    help="Add this run's session to the existing log at -o instead of replacing it (the "
    "reading commands show its latest session; --session picks another).",
)


def report_options() -> Callable[[F], F]:
    """``--format`` (the report formats: ``renderers.RENDERERS``) and ``-o/--output``, the same
    in every command that writes a report."""
    from llamacpp_instr.converters.reports.renderers import RENDERERS

    def deco(f: F) -> F:
        f = output_option("Write the report to this file instead of stdout.")(f)
        f = click.option(
            "--format",
            "fmt",
            type=click.Choice(list(RENDERERS)),
            default="text",
            show_default=True,
            help=one_of([r.about for r in RENDERERS.values()]) + ".",
        )(f)
        return f

    return deco


def one_of(choices: Sequence[str]) -> str:
    """``a, b or c``."""
    return " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)


# instr fit, instr plan: rank a mixture of experts' placements instead (deciding/moe_plan.py)
experts_option = click.option(
    "--experts",
    is_flag=True,
    help="Rank where a mixture of experts' expert weights go instead: the other layers where -ngl "
    "puts them (default all), the experts of the first N layers on the CPU for each N "
    "(--n-cpu-moe N) and, per count, the layers cheapest to keep there (an -ot rule), each "
    "checked against the memory with llama.cpp's projection of the model loaded with its rules "
    "and priced from the logs' measured ops, copies and expert traffic (their routing); each "
    "with its command line and -ot rule.",
)


def rpc_link_options(f: F) -> F:
    """--rpc-rate and --rpc-rtt: the RPC servers' network to price a setting at (instr predict)."""
    for option in reversed(
        [
            click.option(
                "--rpc-rate",
                "rpc_rate",
                metavar="RATE",
                default=None,
                help="Price the RPC servers' network at this rate, in bits/s (100M, 1G, "
                "2.5Gbit); the log's measured rate without it.",
            ),
            click.option(
                "--rpc-rtt",
                "rpc_rtt",
                metavar="TIME",
                default=None,
                help="Price the RPC servers' network at this round trip (2ms, 500us); the log's "
                "measured one without it.",
            ),
        ]
    ):
        f = option(f)
    return f
