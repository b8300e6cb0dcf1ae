"""``instr demo``: a self-check a new user (or the container CI) can run in one command."""

from __future__ import annotations

from pathlib import Path

import click

from llamacpp_instr.commands import out_dir_alias, output_option

DEMO_PROMPT = "The capital of France is"


@click.command("demo")
@output_option("Directory for demo.log and demo.pftrace.", directory=True, default=Path("."))
@out_dir_alias
@click.option("-n", "--n-predict", default=16, show_default=True, help="Tokens to generate.")
def command(output: Path, n_predict: int) -> None:
    """Run the bundled SmolLM2-135M at the detailed level, convert the log to a Perfetto trace,
    and check both: every log line parses, the session ended ok, every generated token's step holds
    per-op timings, and the trace was written. Exit status 2 if anything is off."""
    import orjson

    from llamacpp_instr import models, runner
    from llamacpp_instr.converters.errors import UserError

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

    records = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    kinds = {r["step"]: r["kind"] for r in records if r["type"] == "step_begin"}
    timed = {r["step"] for r in records if r["type"] == "compute" and r.get("ops")}
    end = records[-1]
    if end["type"] != "session_end" or end["status"] != "ok":
        raise UserError(f"demo log {log} did not end with an ok session_end")
    if not all(s in timed for s in kinds):
        raise UserError(f"demo log {log}: some steps have no per-op timings")
    n_ops = sum(len(r["ops"]) for r in records if r["type"] == "compute")
    click.echo(
        f"log ok: {log} ({len(records)} records, {len(kinds)} steps, {n_ops} timed ops, "
        f"{result.n_generated} tokens generated)"
    )

    to_perfetto = click.get_current_context().find_root().command
    convert = getattr(to_perfetto, "commands", {}).get("to-perfetto")
    if convert is None:
        raise UserError("this installation has no to-perfetto command")
    trace = output / "demo.pftrace"
    click.get_current_context().invoke(convert, log=log, output=trace)
    if not trace.is_file() or trace.stat().st_size == 0:
        raise UserError(f"no trace written at {trace}")
    click.echo(
        f"trace ok: {trace} ({trace.stat().st_size} bytes); open it at https://ui.perfetto.dev"
    )
