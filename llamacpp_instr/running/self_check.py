"""A self-check a new user (or the container CI) runs in one command (``instr doctor --demo``):
the bundled model run at the detailed level, its log converted to a Perfetto trace, and both
checked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_instr.contract.errors import UserError

PROMPT = "The capital of France is"


@dataclass(frozen=True)
class SelfCheck:
    """Run the bundled SmolLM2-135M for ``n_predict`` tokens, writing demo.log and demo.pftrace
    into ``output``."""

    output: Path = Path(".")
    n_predict: int = 16


@dataclass(frozen=True)
class SelfCheckResult:
    """What was checked: the log (its records, steps, timed ops, tokens generated) and the trace,
    with what its conversion says (``convert.notes``)."""

    log: Path
    records: int
    steps: int
    n_ops: int
    n_generated: int
    trace: Path
    conversion: list[str] = field(default_factory=list)

    def log_line(self) -> str:
        return (
            f"log ok: {self.log} ({self.records} records, {self.steps} steps, {self.n_ops} timed "
            f"ops, {self.n_generated} tokens generated)"
        )

    def trace_line(self) -> str:
        size = self.trace.stat().st_size
        return f"trace ok: {self.trace} ({size} bytes); open it at https://ui.perfetto.dev"


def self_check(request: SelfCheck, on_text: Callable[[str], None] | None = None) -> SelfCheckResult:
    """Run, convert and check: every log line parses, the session ended ok, every generated
    token's step holds per-op timings, and the trace was written; a ``UserError`` (exit status 2)
    says what is off. ``on_text`` hears the generated text."""
    from llamacpp_instr.converters.formats.convert import convert, notes
    from llamacpp_instr.converters.reading.reader import ReadReport
    from llamacpp_instr.converters.session.fold import load
    from llamacpp_instr.converters.session.machine_peaks import session_roofs
    from llamacpp_instr.native import models
    from llamacpp_instr.native.paths import cache_dir
    from llamacpp_instr.running import runner

    request.output.mkdir(parents=True, exist_ok=True)
    log = request.output / "demo.log"
    log.unlink(missing_ok=True)
    cfg = runner.RunConfig(
        model=models.default_model(),
        prompt=PROMPT,
        n_predict=request.n_predict,
        level="detailed",
        out=log,
        ignore_eos=True,
    )
    result = runner.run(cfg, on_text=on_text)
    report = ReadReport()
    sessions = load(log, strict=True, report=report)  # every line must parse
    end = sessions[-1].info.end if sessions else None
    if end is None or end.get("status") != "ok":
        raise UserError(f"demo log {log} did not end with an ok session_end")
    steps = sessions[-1].steps
    if not all(any(c.n_ops for c in s.computes) for s in steps):
        raise UserError(f"demo log {log}: some steps have no per-op timings")
    n_ops = sum(c.n_ops for s in steps for c in s.computes)
    trace = request.output / "demo.pftrace"
    stats, read = convert(log, trace, roofs=session_roofs(None, cache_dir()))
    if not trace.is_file() or trace.stat().st_size == 0:
        raise UserError(f"no trace written at {trace}")
    said = notes(log, trace, stats, read, flows=False)
    return SelfCheckResult(log, report.records, len(steps), n_ops, result.n_generated, trace, said)
