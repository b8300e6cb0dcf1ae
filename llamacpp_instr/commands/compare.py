"""``instr compare``: two runs of the same prompt (e.g. Q4_K_M vs Q8_0) side by side."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("compare")
@click.argument("session_a", type=click.Path(path_type=Path))
@click.argument("session_b", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "csv", "json", "html"]),
    default="text",
    show_default=True,
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), default=None, help="Write to a file."
)
def command(session_a: Path, session_b: Path, fmt: str, output: Path | None) -> None:
    """Compare two session logs: memory (weights, KV cache, compute), prompt and generation
    tokens/s, time per op type and per layer, generated-token agreement and, when both are verbose
    logs with top-k logits, top-1 agreement and a KL-divergence estimate per step and overall.
    Record both at detailed level or above (generated tokens come from the step records)."""
    import json

    from llamacpp_instr.converters import compare, load_session

    a, b = load_session(session_a), load_session(session_b)
    c = compare.compare_sessions(
        a, b, compare.generated_tokens(session_a), compare.generated_tokens(session_b)
    )
    if "warning" in c:
        click.echo(f"warning: {c['warning']}", err=True)
    renderers = {
        "text": compare.render_text,
        "markdown": compare.render_markdown,
        "csv": compare.render_csv,
        "html": compare.render_html,
        "json": lambda c: json.dumps(c, indent=2, default=str) + "\n",
    }
    text = renderers[fmt](c)
    if output:
        output.write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
