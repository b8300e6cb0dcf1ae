"""A session log to a trace file: the reader, the layout and a writer, wired once for
``instr to-perfetto`` and for ``llamacpp_instr.to_perfetto``. ``WRITERS`` is the one list of trace
formats."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from llamacpp_instr.contract.errors import UserError

from ..reading.reader import ReadReport
from ..session.kv_flows import KvFlows
from ..session.machine_peaks import Roof
from ..traces.items import LayoutStats, Selection


@dataclass(frozen=True)
class TraceWriter:
    """A trace format: what it is (``instr to-perfetto --format``'s help says it), its default
    output's extension, and its writer (``load()``: loaded when first used)."""

    about: str
    suffix: str
    load: Callable[[], Callable[[Iterable[Any], IO[bytes]], Any]]


def _perfetto() -> Callable[[Iterable[Any], IO[bytes]], Any]:
    from .perfetto import write_perfetto_fast

    return write_perfetto_fast


def _chrome_json() -> Callable[[Iterable[Any], IO[bytes]], Any]:
    from .chrome_json import write_chrome_json

    return write_chrome_json


WRITERS = {
    "pftrace": TraceWriter("Perfetto protobuf", ".pftrace", _perfetto),
    "json": TraceWriter("Chrome trace-event JSON for legacy viewers", ".json", _chrome_json),
}


def trace_writer(fmt: str) -> TraceWriter:
    """The writer of trace format ``fmt`` (a one-line error for an unknown one)."""
    w = WRITERS.get(fmt)
    if w is None:
        raise UserError(f"unknown trace format {fmt!r}: choose {' or '.join(WRITERS)}")
    return w


def default_output(log: Path, fmt: str) -> Path:
    """LOG with its extension replaced (``.gz`` first): ``session.log`` and ``session.log.gz`` ->
    ``session.pftrace``, or ``session.json`` for Chrome JSON (the format's ``suffix``)."""
    suffix = trace_writer(fmt).suffix
    base = log.with_suffix("") if log.suffix == ".gz" else log
    out = base.with_suffix(suffix) if base.name and base.stem else log.with_name(log.name + suffix)
    if out == log:  # a log already named like its trace: never write over the input
        out = log.with_name(log.name + suffix)
    return out


def kv_flows_for(log: Path, sel: Selection) -> KvFlows | None:
    """With ``sel.flows``, the KV-cache flows of the trace of ``log``: a first pass over the log
    counts each write's readers (see ``kv_flows``)."""
    if not sel.flows:
        return None
    from ..session.fold import iter_events_packed
    from ..session.kv_flows import count

    return count(iter_events_packed(log), sel.layer, sel.wants_step)


@contextlib.contextmanager
def tuned_for(fmt: str) -> Iterator[None]:
    """Process-wide settings that speed up a conversion, set for its length and restored after:
    ``convert`` runs under them, for ``instr to-perfetto`` and the Python API alike. Perfetto:
    whole steps become garbage at once and the conversion makes no reference cycles, so the
    cyclic collector would only rescan them; and the compressing threads need the GIL between
    output blocks, sooner than the default 5 ms switch interval gives it back. JSON: what exists
    before (modules) is set aside from the collections a long conversion triggers."""
    interval = sys.getswitchinterval()
    gc_was = gc.isenabled()
    freeze = fmt == "json" and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    elif fmt != "json":
        gc.disable()
        sys.setswitchinterval(min(interval, 0.0005))
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if freeze:
            gc.unfreeze()
        if gc_was:
            gc.enable()


def convert(
    log: Path,
    out: Path,
    fmt: str = "pftrace",
    sel: Selection | None = None,
    strict: bool = False,
    wrap: Callable[[Iterator[Any]], Iterator[Any]] | None = None,
    roofs: Callable[[Any], Roof | None] | None = None,
) -> tuple[LayoutStats, ReadReport]:
    """Write the trace of ``log`` to ``out`` (via a temporary file: ``out`` is complete or
    absent). ``wrap`` sees the layout's items on their way to the writer (a progress bar);
    ``roofs`` gives each session its roofs (``machine_peaks.session_roofs``), for the ops' roof fraction
    and bound."""
    from ..session.fold import iter_events_packed
    from ..traces.layout import layout_bulk

    write = trace_writer(fmt).load()
    sel = sel or Selection()
    report = ReadReport()
    stats = LayoutStats()
    tmp = out.with_name(out.name + ".partial")
    try:
        with tuned_for(fmt), tmp.open("wb") as f:
            flows = kv_flows_for(log, sel)
            stats.flows = flows.total if flows is not None else 0
            events = iter_events_packed(log, strict=strict, report=report)
            items: Iterator[Any] = layout_bulk(events, sel, stats, flows=flows, roofs=roofs)
            if wrap is not None:
                items = wrap(items)
            write(items, f)
        tmp.replace(out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return stats, report


def notes(log: Path, out: Path, stats: LayoutStats, report: ReadReport, flows: bool) -> list[str]:
    """What a conversion says on stderr: the damaged lines it skipped, a log of several sessions,
    what it wrote."""
    said = [report.summary()] if report.summary() else []
    if stats.sessions > 1:
        said.append(f"note: {log} holds {stats.sessions} sessions: one process each")
    said.append(
        f"wrote {out} ({out.stat().st_size} bytes): {stats.steps} steps, {stats.computes} computes, "
        f"{stats.layers} layer spans, {stats.ops} ops"
        + (f", {stats.flows} KV cache flows" if flows else "")
    )
    return said


def to_perfetto(
    log: str | Path,
    output: str | Path | None = None,
    *,
    fmt: str = "pftrace",
    layer: int | None = None,
    steps: tuple[int, int] | None = None,
    ops: bool = True,
    flows: bool = False,
    strict: bool = False,
    peaks: str | Path | None = None,
    roofline: bool = True,
    peaks_cache: str | Path | None = None,
) -> Path:
    """Convert a session log to a Perfetto trace (or Chrome JSON with ``fmt="json"``) and return
    its path: ``output``, or the log's name with ``.pftrace`` / ``.json``. ``flows`` draws
    arrows from each KV-cache write to the later ops that read it (see ``kv_flows``). Each op's
    args hold its roof fraction and bound against the peaks in ``peaks`` (an ``instr peaks``
    file, refused for a log of another machine), else the peaks that ``peaks_cache`` (the
    directory ``instr peaks`` saves to) holds for the machine that made the log, if measured;
    ``roofline=False`` leaves them out."""
    from ..session.machine_peaks import session_roofs

    log = Path(log)
    out = Path(output) if output is not None else default_output(log, fmt)
    sel = Selection(layer=layer, steps=steps, ops=ops, flows=flows)
    roofs = None
    if roofline:
        given = Path(peaks) if peaks is not None else None
        roofs = session_roofs(given, Path(peaks_cache) if peaks_cache is not None else None)
    convert(log, out, fmt, sel, strict, roofs=roofs)
    return out
