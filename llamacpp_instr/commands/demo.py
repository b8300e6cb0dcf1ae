"""``instr demo``: a self-check a new user (or the container CI) can run in one command."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.cli_shared.deprecated import out_dir_alias
from llamacpp_instr.cli_shared.options import output_option

DEMO_PROMPT = "The capital of France is"


@click.command("demo", hidden=True)
@output_option("Directory for demo.log and demo.pftrace.", directory=True, default=Path("."))
@out_dir_alias
@click.option("-n", "--n-predict", default=16, show_default=True, help="Tokens to generate.")
def command(output: Path, n_predict: int) -> None:
    """The old name of `instr doctor --demo`.

    Run the bundled SmolLM2-135M at the detailed level, convert the log to a Perfetto trace,
    and check both: every log line parses, the session ended ok, every generated token's step holds
    per-op timings, and the trace was written. Exit status 2 if anything is off."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reading.reader import ReadReport
    from llamacpp_instr.converters.session.fold import load
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner

    output.mkdir(parents=True, exist_ok=True)
    log = output / "demo.log"
    log.unlink(missing_ok=True)
    cfg = runner.RunConfig(
        model=models.default_model(),
        prompt=DEMO_PROMPT,
        n_predict=n_predict,
        level="detailed",
        out=log,
        ignore_eos=True,
    )
    result = runner.run(cfg, on_text=runner.echo_stream)
    click.echo("")

    report = ReadReport()
    sessions = load(log, strict=True, report=report)  # every line must parse
    end = sessions[-1].info.end if sessions else None
    if end is None or end.get("status") != "ok":
        raise UserError(f"demo log {log} did not end with an ok session_end")
    steps = sessions[-1].steps
    if not all(any(c.n_ops for c in s.computes) for s in steps):
        raise UserError(f"demo log {log}: some steps have no per-op timings")
    n_ops = sum(c.n_ops for s in steps for c in s.computes)
    click.echo(
        f"log ok: {log} ({report.records} records, {len(steps)} steps, {n_ops} timed ops, "
        f"{result.n_generated} tokens generated)"
    )

    from llamacpp_instr.commands.to_perfetto import command as convert

    trace = output / "demo.pftrace"
    click.get_current_context().invoke(convert, log=log, output=trace)
    if not trace.is_file() or trace.stat().st_size == 0:
        raise UserError(f"no trace written at {trace}")
    click.echo(
        f"trace ok: {trace} ({trace.stat().st_size} bytes); open it at https://ui.perfetto.dev"
    )
