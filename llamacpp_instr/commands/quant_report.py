"""``instr quant-report``: where each model's bytes go, and how two quantizations differ."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("quant-report")
@click.argument("models", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--session",
    "sessions",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A session log to read the weight inventory and run-time memory from (repeatable).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "csv", "json", "html"]),
    default="text",
    show_default=True,
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write to a file instead of stdout.",
)
@click.option(
    "--error-vs",
    "reference",
    type=click.Path(path_type=Path),
    default=None,
    help="Per-tensor dequantization error of each model against this higher-precision GGUF.",
)
@click.option("--top", default=12, show_default=True, help="Rows per table in text and markdown.")
def command(
    models: tuple[Path, ...],
    sessions: tuple[Path, ...],
    fmt: str,
    output: Path | None,
    reference: Path | None,
    top: int,
) -> None:
    """Report per tensor, layer, role and type: bytes, share, bits per weight and compression vs
    F32/F16/BF16, for each MODEL.gguf (read with gguf-py) or --session LOG. With two or more, the
    others are compared side by side with the first: bytes saved per tensor, layer and role, and
    which tensors got a different type."""
    from llamacpp_instr.converters import quant_render
    from llamacpp_instr.converters.errors import UserError
    from llamacpp_instr.converters.quant_report import (
        dequant_error,
        from_gguf,
        from_session,
        report_data,
    )

    if not models and not sessions:
        raise UserError("give at least one MODEL.gguf or --session LOG")
    invs = [from_gguf(m) for m in models] + [from_session(s) for s in sessions]
    error = None
    if reference is not None:
        from_gguf(reference)  # the same checks as the models (exists, is a GGUF, not truncated)
        error = [(str(m), dequant_error(m, reference)) for m in models]
    data = report_data(invs, error)
    if len(invs) > 1:
        for o in data["comparison"]["others"]:
            if o["only_in_baseline"] or o["only_in_other"]:
                click.echo(
                    f"warning: {o['model']} and {data['comparison']['baseline']} have different tensors "
                    f"({len(o['only_in_baseline'])} only in the first, {len(o['only_in_other'])} only in the "
                    "other): different models? comparing what matches",
                    err=True,
                )
    text = quant_render.render(data, fmt, top=top)
    if output:
        output.write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
