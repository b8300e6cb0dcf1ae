"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command) and is named for it (``instr to-perfetto``:
``to_perfetto.py``), so adding a command means adding a file here: ``llamacpp_instr.cli`` imports
a module only when its command runs (or for the help). Modules import heavy dependencies
(llama_cpp, pandas, pyarrow) inside the command function, so ``instr --help`` stays fast and
converter commands work without llama_cpp installed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import SESSION_LEVELS

if TYPE_CHECKING:
    from llamacpp_instr.converters.analysis.frames import SessionFrames

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
#   --metrics      HOST:PORT of an `instr metrics` exporter beside the program (exec, serve)
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
    "--session", "sid", default=None, help="Session id, when the log holds several."
)

# shared by the commands that run a model with a session open (instr run, instr serve)
level_option = click.option(
    "--level",
    type=click.Choice(SESSION_LEVELS),
    default="detailed",
    show_default=True,
    help="minimal: steps + layer spans; detailed: + per-op timings and graph tables; "
    "verbose: + per-thread times, value statistics, top-k logits.",
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
    """``--format text|json`` of the commands that answer with a table of their own, not a report
    (fit, plan, predict; the report commands take ``report_options``)."""
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
topk_option = click.option(
    "--top-k-logits",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Logits kept per token at verbose.",
)
# instr exec, instr serve: an `instr metrics` exporter beside the program (running/exporter_launch.py)
metrics_option = click.option(
    "--metrics",
    metavar="HOST:PORT",
    default=None,
    help="Serve the log's figures to Prometheus at http://HOST:PORT/metrics from a process of its "
    "own beside the program (`instr metrics`).",
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


def always_on_options(requests: bool = True) -> Callable[[F], F]:
    """What bounds a long session's cost and size (``llamacpp_instr.running.always_on``): --sample,
    --sample-requests (with ``requests``: the commands that serve requests), --max-bytes and
    --keep, given to the command as one ``always_on`` argument (an ``AlwaysOn``)."""
    from llamacpp_instr.running.always_on import MAX_SAMPLE

    options = [
        click.option(
            "--sample",
            type=click.IntRange(1, MAX_SAMPLE),
            default=1,
            show_default=True,
            help="Record one decode step in N at --level, the others at minimal (each step "
            "says its level; reports compute per-op figures from the sampled steps).",
        ),
        click.option(
            "--max-bytes",
            type=SizeParam(),
            default=None,
            help="Rotate the log at this size (bytes, or with a K, M or G suffix: 64M): LOG -> "
            "LOG.1 -> ..., each file starting with its own session_start.",
        ),
        click.option(
            "--keep",
            type=click.IntRange(1, 1000),
            default=None,
            help="Rotated files kept, LOG.1 .. LOG.K (default 8; needs --max-bytes).",
        ),
    ]
    if requests:
        options.insert(
            1,
            click.option(
                "--sample-requests",
                type=click.IntRange(1, MAX_SAMPLE),
                default=1,
                show_default=True,
                help="Record the steps of one request in N at --level, the others at minimal.",
            ),
        )

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from llamacpp_instr.running.always_on import AlwaysOn

            try:
                kwargs["always_on"] = AlwaysOn.of(
                    sample=kwargs.pop("sample"),
                    sample_requests=kwargs.pop("sample_requests", 1),
                    max_bytes=kwargs.pop("max_bytes") or 0,
                    keep=kwargs.pop("keep"),
                )
            except UserError as exc:
                raise click.UsageError(str(exc)) from None
            return f(*args, **kwargs)

        out: Any = wrapper
        for option in reversed(options):
            out = option(out)
        return out  # type: ignore[no-any-return]

    return deco


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
    "Session log path (default: llama_instrumentation_YYYYMMDD_HHMMSS.log here)."
)


def deprecated_alias(old: str, new: str, dest: str, **option: Any) -> Callable[[F], F]:
    """The old spelling ``old`` of the option ``new`` (parameter ``dest``), kept for one release:
    hidden from the help, it sets ``dest`` as ``new`` would, with a deprecation note on stderr.
    ``option`` holds its click settings (type, multiple...), the same as ``new``'s."""
    hidden = "deprecated_" + old.lstrip("-").replace("-", "_")

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(hidden)
            if value is None or value == ():
                return f(*args, **kwargs)
            click.echo(
                f"warning: {old} is deprecated and will be removed in the next release; "
                f"use {new}",
                err=True,
            )
            source = click.get_current_context().get_parameter_source(dest)
            if source is ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{old} is the old spelling of {new}: give one of them")
            kwargs[dest] = value
            return f(*args, **kwargs)

        return click.option(old, hidden, hidden=True, default=None, **option)(wrapper)  # type: ignore[return-value]

    return deco


def chunk_size_options(f: F) -> F:
    """``--chunk-size``, the tokens per chunk of quant-eval and quant-sweep (llama-perplexity's -c),
    and its old spelling ``--ctx``, which means the context size everywhere else."""
    f = deprecated_alias("--ctx", "--chunk-size", "chunk_size", type=click.IntRange(min=8))(f)
    return click.option(
        "--chunk-size",
        type=click.IntRange(min=8),
        default=512,
        show_default=True,
        help="Tokens per chunk (llama-perplexity's -c); the second half of each is scored.",
    )(f)


# ``--out`` was run's and serve's name for -o/--output (the session log) until 0.1
out_alias = deprecated_alias("--out", "-o/--output", "output", type=output_type())
# ``--out-dir`` was export's and demo's name for -o/--output (a directory) until 0.1
out_dir_alias = deprecated_alias("--out-dir", "-o/--output", "output", type=output_type(True))


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


def load_log(log: Path, sid: str | None = None, strict: bool = False) -> SessionFrames:
    """The session ``sid`` of ``log`` as the report commands read it: damaged lines skipped and
    said so on stderr, or with ``strict`` the first one a one-line error; against this machine's
    cached peaks, if they fit."""
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.native.paths import cache_dir

    frames = load_session(log, sid, strict=strict, peaks_cache=cache_dir())
    if frames.report.summary():
        click.echo(frames.report.summary(), err=True)
    return frames


def check_output(output: Path | None) -> None:
    """Refuse an output path that can't be written, before any work is done."""
    if output is None:
        return
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {output}: directory {parent} does not exist")


def emit(text: str, output: Path | None) -> None:
    """The rendered report to ``output`` (saying so on stderr) or to stdout."""
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    click.echo(f"wrote {output}", err=True)


# --- where a model's layers run: -ngl/--gpu-layers, --device, --rpc, --tensor-split -------------
# (the values and their checks are llamacpp_instr.running.offload's, shared with the Python API)


class _OffloadValue(click.ParamType):
    """A value parsed by one of offload.py's parsers; its UserError is click's usage error."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def __repr__(self) -> str:
        return f"OffloadValue({self.name!r}, {self._parse.__name__})"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name  # as written (N|all), not upper-cased

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already parsed
        try:
            return self._parse(value)
        except UserError as exc:
            self.fail(str(exc), param, ctx)


def offload_options(
    *,
    layers: bool = True,
    device: bool = True,
    rpc: bool = True,
    split: bool = True,
    layers_default: str | None = None,
) -> Callable[[F], F]:
    """The offload options a command takes, passed to it as one ``offload`` (an
    ``offload.Offload``): -ngl/--gpu-layers, --device, --rpc and --tensor-split, each defined
    here once. ``layers_default``: what -ngl's default is in words, where it is not 0 (a log's
    placement, a search)."""
    from llamacpp_instr.running import offload as o
    from llamacpp_instr.running.rpc_endpoint import PROBE_TIMEOUT_S

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["offload"] = o.Offload(
                gpu_layers=kwargs.pop("gpu_layers", 0),
                devices=kwargs.pop("device", None),
                rpc=kwargs.pop("rpc", None) or (),
                tensor_split=kwargs.pop("tensor_split", None),
            )
            return f(*args, **kwargs)

        g: Any = wrapper
        if split:
            g = click.option(
                "--tensor-split",
                type=_OffloadValue("P0,P1,...", o.parse_tensor_split),
                default=None,
                help="Share of the offloaded layers per device, in the order of the devices "
                "used (--device's; by default RPC servers first, then GPUs), e.g. 3,1.",
            )(g)
        if rpc:
            g = click.option(
                "--rpc",
                type=_OffloadValue("HOST:PORT[,...]", o.parse_rpc),
                default=None,
                help="ggml RPC servers (llama.cpp's rpc-server) to offload to, comma-separated: "
                "each becomes a device RPC0, RPC1...; each must answer within "
                f"{PROBE_TIMEOUT_S:g} s.",
            )(g)
        if device:
            g = click.option(
                "--device",
                type=_OffloadValue("NAME[,...]", o.parse_devices),
                default=None,
                help="ggml devices to offload to, comma-separated (Vulkan0, RPC0...: `instr "
                "doctor` lists them); none = the CPU only. Default: every GPU and RPC device.",
            )(g)
        if layers:
            g = click.option(
                "-ngl",
                "--gpu-layers",
                type=_OffloadValue("N|all", o.parse_gpu_layers),
                default=0,
                show_default=layers_default or True,
                help="Layers to offload to the GPU and RPC devices (llama.cpp's -ngl), or all; "
                "0 keeps the model on the CPU.",
            )(g)
        return g  # type: ignore[no-any-return]

    return deco
