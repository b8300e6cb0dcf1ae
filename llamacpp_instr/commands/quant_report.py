"""``instr quant-report``: where each model's bytes go, and how two quantizations differ."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.deprecated import deprecated_alias
from llamacpp_instr.cli_shared.options import report_options, top_option
from llamacpp_instr.cli_shared.output import check_output, emit


@click.command("quant-report")
@click.argument("models", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A session log to read the weight inventory and run-time memory from (repeatable).",
)
# --session, the old spelling of --log here, means a session id in every other command
@deprecated_alias("--session", "--log", "logs", multiple=True, type=click.Path(path_type=Path))
@report_options()
@click.option(
    "--error-vs",
    "reference",
    type=click.Path(path_type=Path),
    default=None,
    help="Per-tensor dequantization error of each model against this higher-precision GGUF.",
)
@top_option
def command(
    models: tuple[Path, ...],
    logs: tuple[Path, ...],
    fmt: str,
    output: Path | None,
    reference: Path | None,
    top: int,
) -> None:
    """Report per tensor, layer, role and type: bytes, share, bits per weight and compression vs
    F32 and 16-bit, for each MODEL.gguf (read with gguf-py) or --log LOG. With two or more,
    the others are compared side by side with the first: bytes saved per tensor, layer and role,
    and which tensors got a different type. The HTML page charts bytes per layer (embedding and
    output apart), bits per weight by role, and bytes saved per layer and role."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.quant.inventory import (
        dequant_error,
        from_gguf,
        from_session,
        report_data,
    )
    from llamacpp_instr.converters.reports.quant.render import quant_report
    from llamacpp_instr.converters.reports.renderers import render

    if not models and not logs:
        raise UserError("give at least one MODEL.gguf or --log LOG")
    check_output(output)
    invs = [from_gguf(m) for m in models] + [from_session(s) for s in logs]
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
    emit(render(quant_report(data, top or None), fmt, top=top or None), output)
