"""``instr compare``: two runs of the same prompt (e.g. Q4_K_M vs Q8_0) side by side."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import report_options, strict_option, top_option
from llamacpp_instr.cli_shared.output import check_output, emit, load_log


@click.command("compare")
@click.argument("session_a", type=click.Path(path_type=Path))
@click.argument("session_b", type=click.Path(path_type=Path))
@top_option
@report_options()
@strict_option
def command(
    session_a: Path, session_b: Path, top: int, fmt: str, output: Path | None, strict: bool
) -> None:
    """Compare two session logs: memory (weights, KV cache, compute), prompt and generation
    tokens/s, time per op type and per layer, generated-token agreement and, when both are verbose
    logs with top-k logits, top-1 agreement and a KL-divergence estimate per step and overall;
    runs with images or sounds (mtmd), their encoders side by side: an encode's time, per op type
    and per part of the encoder, the tokens each medium costs. Record both at detailed level or
    above (generated tokens come from the step records).

    The agreement is free-running: after the first differing token the runs continue from
    different text. It shows how soon outputs diverge, not a quantization's quality: for that,
    `instr quant-eval` (teacher-forced perplexity and KL divergence)."""
    from llamacpp_instr.converters.reports import compare
    from llamacpp_instr.converters.reports.renderers import render

    check_output(output)
    a, b = load_log(session_a, strict=strict), load_log(session_b, strict=strict)
    c = compare.compare_sessions(a, b, a.generated_tokens, b.generated_tokens)
    if "warning" in c:
        click.echo(f"warning: {c['warning']}", err=True)
    emit(render(compare.compare_report(c), fmt, top=top or None), output)
