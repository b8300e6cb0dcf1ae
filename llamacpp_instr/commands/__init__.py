"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command). ``llamacpp_instr.cli`` discovers them, so adding a
command means adding a file here. Modules import heavy dependencies (llama_cpp, pandas, perfetto)
inside the command function, so ``instr --help`` stays fast and converter commands work without
llama_cpp installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from llamacpp_instr.converters.errors import UserError
from llamacpp_instr.converters.schema import SESSION_LEVELS

F = TypeVar("F", bound=Callable[..., Any])

# shared by every command that reads a log which may hold several sessions
session_option = click.option(
    "--session", "sid", default=None, help="Session id, when the log holds several."
)

REPORT_FORMATS = ("text", "markdown", "csv", "json", "html")

# shared by the commands that run a model with a session open (instr run, instr serve)
level_option = click.option(
    "--level",
    type=click.Choice(SESSION_LEVELS),
    default="detailed",
    show_default=True,
    help="minimal: steps + layer spans; detailed: + per-op timings and graph tables; "
    "verbose: + per-thread times, value statistics, top-k logits.",
)
log_option = click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Session log path (default: llama_instrumentation_YYYYMMDD_HHMMSS.log here).",
)
ctx_option = click.option(
    "--ctx",
    "n_ctx",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Context size in tokens.",
)
threads_option = click.option(
    "-t",
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads (default: all cores, at most 8).",
)
topk_option = click.option(
    "--top-k-logits",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Logits kept per token at verbose.",
)


def report_options(formats: Sequence[str] = REPORT_FORMATS) -> Callable[[F], F]:
    """``--format`` and ``-o/--output``, the same in every command that writes a report."""

    def deco(f: F) -> F:
        f = click.option(
            "-o",
            "--output",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="Write the report to this file instead of stdout.",
        )(f)
        f = click.option(
            "--format",
            "fmt",
            type=click.Choice(list(formats)),
            default="text",
            show_default=True,
            help="text (terminal), markdown, csv (the main table), json (all of it, raw values) "
            "or html (one self-contained page with charts and sortable tables).",
        )(f)
        return f

    return deco


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
