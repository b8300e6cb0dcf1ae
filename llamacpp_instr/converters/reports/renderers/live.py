"""The live view of ``instr follow`` / ``instr run --live``, drawn with rich (imported here only),
or one plain line per step where stdout is not a terminal."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.units import fmt_bytes

from ...analysis.follow import LiveState


def view(state: LiveState) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    p50, p90, p99 = state.step_ms_percentiles()
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]{state.model or 'model'}[/]",
        f"level {state.level}",
        f"session {state.sid}",
        f"[{'green' if state.status == 'running' else 'yellow'}]{state.status}[/]",
    )
    head.add_row(
        f"steps {state.steps_done}",
        f"prompt {state.prompt_tokens} tok",
        f"generated {state.gen_tokens} tok",
        f"[bold]{state.gen_tok_s():.1f} tok/s[/]",
    )
    head.add_row(
        f"step p50 {p50:.2f} ms",
        f"p90 {p90:.2f} ms",
        f"p99 {p99:.2f} ms",
        f"KV cells {state.kv_used()}",
    )
    if state.encodes_done:
        head.add_row(f"encodes {state.encodes_done}", f"{state.encode_ns / 1e6:.2f} ms", "", "")
    if state.memory:
        head.add_row(
            f"weights {fmt_bytes(state.memory.get('weights', 0))}",
            f"KV cache {fmt_bytes(state.memory.get('kv_cache', 0))}",
            f"compute {fmt_bytes(state.memory.get('compute', 0))}",
            "",
        )
    layers = Table(title="last step: time per layer", show_header=False, box=None)
    top = max(state.last_layers.values(), default=1)
    for layer in sorted(state.last_layers):
        ns = state.last_layers[layer]
        bar = "█" * max(1, int(30 * ns / top))
        layers.add_row(f"layer {layer}", f"{ns / 1e3:8.1f} µs", f"[cyan]{bar}[/]")
    ops = Table(title=f"top ops, last {len(state.window)} steps", box=None)
    ops.add_column("op")
    ops.add_column("ms", justify="right")
    for label, ns in state.top_ops():
        ops.add_row(label, f"{ns / 1e6:.2f}")
    return Group(Panel(head, title="instr follow"), layers, ops)


def follow(log: Path, wait: float, stop: threading.Event | None = None) -> str:
    """Follow ``log`` (``reading.tail``) and show it: the live view on a terminal, one line per
    step otherwise, until the session ends or ``stop`` is set. Returns the session's status."""
    from ...reading.tail import tail

    state = LiveState()
    records = tail(log, wait=wait, stop=stop.is_set if stop else None, to_session_end=True)
    if not sys.stdout.isatty():
        for rec in records:
            step = state.add(rec)
            if step is not None:
                sys.stdout.write(state.line(step) + "\n")
                sys.stdout.flush()
        return state.status
    from rich.live import Live

    last = 0.0
    with Live(view(state), refresh_per_second=4, transient=False) as live:
        for rec in records:
            state.add(rec)
            now = time.monotonic()
            if now - last > 0.25 or rec.get("type") == "session_end":
                live.update(view(state))
                last = now
    return state.status
