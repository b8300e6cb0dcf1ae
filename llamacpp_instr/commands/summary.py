"""``instr summary``: where a session's time goes, as text or any report format."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import (
    peaks_option,
    report_options,
    session_option,
    strict_option,
    top_option,
)
from llamacpp_instr.cli_shared.output import check_output, emit, load_log


@click.command("summary")
@click.argument("log", type=click.Path(path_type=Path))
@click.option(
    "--by",
    "by",
    type=click.Choice(["op", "layer", "node", "media"]),
    default="op",
    show_default=True,
    help="Group op time by op type, layer or graph node; media: each image's or sound's time "
    "as the main table (csv's).",
)
@top_option
@peaks_option
@report_options()
@session_option
@strict_option
def command(
    log: Path,
    by: str,
    top: int,
    peaks_file: Path | None,
    fmt: str,
    output: Path | None,
    sid: str | None,
    strict: bool,
) -> None:
    """Summarize a session LOG: tokens/s for prompt and generation, step-time percentiles, op-time
    coverage, and time per op type, layer or node (count, total, mean, p50, p95, share, achieved
    GFLOP/s and GB/s). The HTML page also shows where a generation step's time goes: per layer by
    op type, a layer x op-type heatmap, the step-time histogram and tokens/s over the run. With
    this machine's peaks (`instr peaks`), every op against its roofline: arithmetic intensity,
    fraction of the roof, the bound, and decode against the memory bandwidth. A speculating
    llama-server's figures are its target's (its verify steps give the tokens they accepted, over
    their time and the draft's); the draft gets a line of its own, and the verdict says whether
    speculation saved time against a plain decode of the same tokens, priced from the log's
    single-token target steps (or predict's model where it has none); HTML adds acceptance by
    draft position and each request's draft, verify and rejected time. A run with images or
    sounds (mtmd) shows each one's time: its load, preprocessing, encodes (by op type and by part
    of the encoder: embedding, blocks, projector), the prefill of its tokens and the tokens it
    costs, its encoder's first medium apart from the others."""
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.summary import summary_report

    check_output(output)
    frames = load_log(log, sid, strict)
    if peaks_file is not None:
        from llamacpp_instr.converters.analysis import roofline
        from llamacpp_instr.converters.session import machine_peaks

        roofline.apply(frames, machine_peaks.for_file(peaks_file, frames.info))
    from llamacpp_instr.deciding.prediction.spec_predict import model_price
    from llamacpp_instr.running.measuring import ThisMachine

    report = summary_report(
        frames, by, top or None, spec_price=lambda f: model_price(f, ThisMachine())
    )
    emit(render(report, fmt, top=top or None), output)
