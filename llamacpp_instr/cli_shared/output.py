"""What the commands share on the way out: a log read for a report, an output path checked
before the work, a rendered report written to -o/--output or stdout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.contract.errors import UserError

if TYPE_CHECKING:
    from llamacpp_instr.converters.analysis.frames import SessionFrames
    from llamacpp_instr.converters.reports.report import Report


def load_log(log: Path, sid: str | None = None, strict: bool = False) -> SessionFrames:
    """The session ``sid`` of ``log`` (default: its latest) as the report commands read it:
    damaged lines skipped and said so on stderr, or with ``strict`` the first one a one-line
    error; against this machine's cached peaks, if they fit. A log of several sessions is said on
    stderr: which one this is, and how to pick another."""
    from llamacpp_instr.converters.analysis.frames import choose, load_sessions, sessions_note
    from llamacpp_instr.native.paths import cache_dir

    sessions = load_sessions(log, strict=strict, peaks_cache=cache_dir())
    frames = choose(sessions, sid, log)
    if frames.report.summary():
        click.echo(frames.report.summary(), err=True)
    sids = [(s.info.sid, s.info.wall_time) for s in sessions]
    if note := sessions_note(log, sids, frames.info.sid):
        click.echo(f"note: {note}", err=True)
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


def answer(report: Report, fmt: str, failure: UserError | None = None) -> None:
    """A library call's answer on stdout, its report rendered in ``fmt``; then the failure the
    answer ends with (nothing fits: exit 3; not covered: exit 2), after its output."""
    from llamacpp_instr.converters.reports.renderers import render

    emit(render(report, fmt), None)
    if failure is not None:
        raise failure
