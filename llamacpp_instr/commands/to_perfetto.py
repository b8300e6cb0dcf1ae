"""``instr to-perfetto``: session log -> Perfetto trace (or Chrome JSON), streamed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llamacpp_instr.cli_shared.options import output_option, peaks_option, strict_option
from llamacpp_instr.converters.formats.convert import WRITERS, default_output

DEFAULT_FORMAT = "pftrace"


def _steps(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    a, sep, b = value.partition(":")
    try:
        first = int(a) if a else 0
        last = int(b) if b else 1 << 62
    except ValueError:
        raise click.BadParameter(f"expected A:B (step indices), got {value!r}") from None
    if not sep or first < 0 or last <= first:
        raise click.BadParameter(f"expected A:B with 0 <= A < B, got {value!r}")
    return first, last


@click.command("to-perfetto")
@click.argument("log", type=click.Path(path_type=Path))
@output_option(
    f"Output file (default: LOG with {WRITERS[DEFAULT_FORMAT].suffix}"
    + "".join(
        f", or {w.suffix} with --format {n}" for n, w in WRITERS.items() if n != DEFAULT_FORMAT
    )
    + ")."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(WRITERS)),
    default=DEFAULT_FORMAT,
    show_default=True,
    help=", or ".join(w.about for w in WRITERS.values()) + ".",
)
@click.option(
    "--layer", type=int, default=None, help="Only this transformer layer's spans and ops."
)
@click.option("--steps", "steps", default=None, metavar="A:B", help="Only decode steps A..B-1.")
@click.option("--no-ops", is_flag=True, help="Steps and layers only (a much smaller trace).")
@click.option(
    "--flows",
    is_flag=True,
    help="Draw an arrow from each KV cache write to every later op that reads those cells "
    "(about layers x steps^2 arrows: choose a --layer or --steps for long runs).",
)
@peaks_option
@strict_option
def command(
    log: Path,
    output: Path | None,
    fmt: str,
    layer: int | None,
    steps: str | None,
    no_ops: bool,
    flows: bool,
    peaks_file: Path | None,
    strict: bool,
) -> None:
    """Convert a session LOG (plain or .gz) into a trace for https://ui.perfetto.dev.

    Each session becomes a process: a "decode steps" track with one slice per llama_decode
    (prompt or generation, token ids and text in its args), nested compute (ubatch), layer and op
    slices (tensor shapes and types, the weight a matmul reads, estimated FLOPs and bytes with
    achieved GFLOP/s and GB/s), per-thread tracks for verbose logs, and counters (tokens/s, KV
    cache cells, memory; for a mixture of experts with its routing recorded, the experts each
    layer used per ubatch). Images and sounds (mtmd): an encoder track per encoder with each encode
    laid out as a step is (its blocks as layers, its projector the last), each medium's load and
    preprocessing, and a flow from each encode to the steps that decode its embeddings. Damaged
    lines are skipped and reported on stderr.

    With this machine's peaks (`instr peaks`), each op also shows its arithmetic intensity, its
    fraction of the roofline at that intensity (roof_fraction) and which roof binds it (bound:
    memory or compute).

    With --flows, clicking a KV cache write (SET_ROWS into cache_k_l*/cache_v_l*) shows the
    attention ops of this and later steps that read what it wrote, and clicking an attention op
    shows the writes it read.
    """
    from llamacpp_instr.converters.formats.convert import convert, notes
    from llamacpp_instr.converters.session.machine_peaks import session_roofs
    from llamacpp_instr.converters.traces.items import Selection
    from llamacpp_instr.native.paths import cache_dir

    if flows and no_ops:
        raise click.UsageError("--flows connects op slices: it cannot go with --no-ops")
    sel = Selection(layer=layer, steps=_steps(steps), ops=not no_ops, flows=flows)
    out = output or default_output(log, fmt)
    stats, report = convert(
        log,
        out,
        fmt,
        sel,
        strict,
        wrap=lambda items: _progress(items, log),
        roofs=session_roofs(peaks_file, cache_dir()),
    )
    for line in notes(log, out, stats, report, flows):
        click.echo(line, err=True)


def _progress(items, log: Path):  # type: ignore[no-untyped-def]
    """Pass items through, drawing a progress bar on stderr for big logs when it is a terminal."""
    if not sys.stderr.isatty() or log.stat().st_size < 16 << 20:
        yield from items
        return
    from llamacpp_instr.converters.traces.items import Slice

    with click.progressbar(length=0, label="converting", file=sys.stderr, show_pos=True) as bar:
        for it in items:
            if isinstance(it, Slice) and it.category == "step":
                bar.update(1)
            yield it
