"""``instr compare``: two runs of the same prompt (e.g. Q4_K_M vs Q8_0) side by side, or a server's
recording and its replay request by request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llamacpp_instr.cli_shared.options import report_options, strict_option, top_option
from llamacpp_instr.cli_shared.output import check_output, emit, load_log


def _slo(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    from llamacpp_instr.converters.session.replay_figures import parse_slo

    return None if value is None else parse_slo(value)


@click.command("compare")
@click.argument("session_a", type=click.Path(path_type=Path))
@click.argument("session_b", type=click.Path(path_type=Path))
@top_option
@report_options()
@strict_option
@click.option(
    "--slo",
    callback=_slo,
    default=None,
    help="A recording and its replay: the service-level objective of goodput (ttft=MS,tpot=MS).",
)
def command(
    session_a: Path,
    session_b: Path,
    top: int,
    fmt: str,
    output: Path | None,
    strict: bool,
    slo: Any,
) -> None:
    """Compare two session logs: memory (weights, KV cache, compute), prompt and generation
    tokens/s, time per op type and per layer, generated-token agreement and, when both are verbose
    logs with top-k logits, top-1 agreement and a KL-divergence estimate per step and overall;
    runs with images or sounds (mtmd), their encoders side by side: an encode's time, per op type
    and per part of the encoder, the tokens each medium costs. Record both at detailed level or
    above (generated tokens come from the step records). A server's recording (A) and its
    replay (B, `instr replay`): each replayed request against its recording, as `instr replay`
    reports them (TTFT, time per output token, end to end, prompt-cache reuse, the same tokens;
    per side the p50/p90/p99, throughput and goodput under --slo), its times its client's from
    the responses file beside B, else its server's; two logs that are not, one line saying so.

    The agreement is free-running: after the first differing token the runs continue from
    different text. It shows how soon outputs diverge, not a quantization's quality: for that,
    `instr quant-eval` (teacher-forced perplexity and KL divergence)."""
    from llamacpp_instr.converters.reports import compare
    from llamacpp_instr.converters.reports.compare_requests import requests_comparison
    from llamacpp_instr.converters.reports.renderers import render

    check_output(output)
    a, b = load_log(session_a, strict=strict), load_log(session_b, strict=strict)
    c = compare.compare_sessions(a, b, a.generated_tokens, b.generated_tokens)
    requests = requests_comparison(session_a, session_b, slo)  # a recording and its replay
    if requests is not None:
        c["requests"] = requests
    if "warning" in c:
        click.echo(f"warning: {c['warning']}", err=True)
    emit(render(compare.compare_report(c), fmt, top=top or None), output)
