"""``instr requests``: a server's requests, slowest first, and why each one took its time."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import (
    report_options,
    session_option,
    strict_option,
    top_option,
)
from llamacpp_instr.cli_shared.output import check_output, emit, load_log


@click.command("requests")
@click.argument("log", type=click.Path(path_type=Path))
@top_option
@report_options()
@session_option
@strict_option
def command(
    log: Path, top: int, fmt: str, output: Path | None, sid: str | None, strict: bool
) -> None:
    """Why a request was slow: LOG's requests (llama-server under `instr exec`, or `instr serve`),
    slowest first, their time split into queue, prompt, generation and stream. For the slowest:
    how much of the prompt the server's prompt cache reused, and when less than it could, why
    (another slot held it, it was evicted, a sliding window, the prompt diverged, where and with
    what text); and each late token, with what shared its batch ("token 212 of task-41 came 380 ms
    late: slot 2 was prefilling 1,536 tokens of task-44 in the same batch"). Speculating: what
    each request drafted and had accepted, its draft, verify and rejected time, and whether the
    drafts paid. For a mixture of experts whose routing the log recorded (--level detailed): the
    experts each request's own steps routed to, per layer (a step shared with other requests is
    counted, not split). A request of several tasks (n_cmpl completions of a prompt, or several
    prompts) is one row: its tokens all its tasks', its generation until the last of them let its
    slot go, and each task's slot and tokens. With images or sounds (mtmd): the encodes that
    served each request's prompt, beside its media's and its text's prefill, as the parts of its
    first token's time. `--format json`: one object per request under "requests"."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.requests_report import requests_report

    check_output(output)
    frames = load_log(log, sid, strict)
    from llamacpp_instr.deciding.prediction.spec_predict import model_price
    from llamacpp_instr.running.measuring import ThisMachine

    report = requests_report(
        frames, top or None, spec_price=lambda f: model_price(f, ThisMachine())
    )
    if not report.data["requests"]:
        raise UserError(f"{log}: no request records (a server's log: instr exec llama-server ...)")
    emit(render(report, fmt, top=top or None), output)
