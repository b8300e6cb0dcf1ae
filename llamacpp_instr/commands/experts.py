"""``instr experts``: which experts a mixture of experts routed to, layer by layer."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import report_options, session_option, strict_option
from llamacpp_instr.cli_shared.output import check_output, emit, load_log


@click.command("experts")
@click.argument("log", type=click.Path(path_type=Path))
@report_options()
@session_option
@strict_option
def command(log: Path, fmt: str, output: Path | None, sid: str | None, strict: bool) -> None:
    """Which experts fired: per layer of a mixture of experts, each expert's load over LOG's steps
    (a heatmap in the HTML report), the imbalance (the busiest expert over the mean), the routing's
    entropy, the share of the experts each ubatch touched, and the hottest experts. Needs a log
    recorded at --level detailed on the CPU; one without routing says so. `--format json`: per
    layer under "layers"."""
    from llamacpp_instr.converters.reports.experts_report import experts_report
    from llamacpp_instr.converters.reports.renderers import render

    check_output(output)
    frames = load_log(log, sid, strict)
    emit(render(experts_report(frames, log), fmt), output)
