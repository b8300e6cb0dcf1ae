"""Following a session log while another process writes it (``instr follow``, ``instr run --live``).

``tail_records`` yields records as lines are appended (waiting for the file to appear, holding a
partial last line until it completes). ``LiveState`` keeps only what the view shows, over a window
of recent steps: memory does not grow with the run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .decode import graph_table
from .errors import UserError

WINDOW = 64  # steps the statistics cover


def tail_records(
    path: Path,
    *,
    poll: float = 0.05,
    wait_for_file: float = 30.0,
    stop: Callable[[], bool] | None = None,
) -> Iterator[dict[str, Any]]:
    """Records of ``path`` as they are written, from the start; returns after ``session_end``,
    when ``stop()`` says so, or raises UserError if the file never appears."""
    t0 = time.monotonic()
    while not path.exists():
        if stop and stop():
            return
        if time.monotonic() - t0 > wait_for_file:
            raise UserError(f"log file not found: {path} (waited {wait_for_file:.0f} s)")
        time.sleep(poll)
    if path.is_dir():
        raise UserError(f"log path is a directory: {path}")
    with path.open("rb") as f:
        pending = b""
        while True:
            chunk = f.readline()
            if not chunk:
                if stop and stop():
                    return
                time.sleep(poll)
                continue
            pending += chunk
            if not pending.endswith(b"\n"):
                continue  # the writer is mid-line: wait for the rest
            line, pending = pending, b""
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                try:
                    rec = orjson.loads(line.decode("utf-8", "replace").encode())
                except orjson.JSONDecodeError:
                    continue  # a damaged line: skip it, as the converters do
            if not isinstance(rec, dict):
                continue
            yield rec
            if rec.get("type") == "session_end":
                return


@dataclass
class StepView:
    step: int
    kind: str
    n_tokens: int
    dur_ns: int
    kv_used: int
    request: str | None = None


@dataclass
class LiveState:
    """What the live view shows, updated record by record."""

    model: str = ""
    level: str = ""
    sid: str = ""
    memory: dict[str, int] = field(default_factory=dict)
    n_layer: int = 0
    status: str = "running"
    steps_done: int = 0
    prompt_tokens: int = 0
    gen_tokens: int = 0
    window: deque[StepView] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # layer -> ns in the last step's computes
    last_layers: dict[int, int] = field(default_factory=dict)
    # op label -> ns over the window's steps (decayed by dropping old steps' contributions)
    _op_by_step: deque[dict[str, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _labels: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    _begin: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    _step_layers: dict[int, int] = field(default_factory=dict)
    _step_ops: dict[str, int] = field(default_factory=dict)

    def add(self, rec: dict[str, Any]) -> StepView | None:
        """Apply one record; returns the step it completed, if any."""
        t = rec.get("type")
        if t == "session_start":
            m = rec.get("model") or {}
            self.model = str(m.get("name") or m.get("architecture") or "")
            self.n_layer = int(m.get("n_layer") or 0)
            self.level = str(rec.get("level", ""))
            self.sid = str(rec.get("sid", ""))
            self.memory = {
                k: int(v) for k, v in (rec.get("memory") or {}).items() if k != "buffers"
            }
        elif t == "graph":
            key = (int(rec.get("ctx", 1)), int(rec["graph"]))
            # graph ids are per session: keep the last few tables only
            if len(self._labels) > 16:
                self._labels.pop(next(iter(self._labels)))
            try:
                self._labels[key] = [n.label for n in graph_table(rec).nodes]
            except (KeyError, TypeError, ValueError):
                pass  # a damaged table: its ops go unnamed, as the converters skip it
        elif t == "step_begin":
            self._begin[(int(rec.get("ctx", 1)), int(rec["step"]))] = rec
            self._step_layers = {}
            self._step_ops = {}
        elif t == "compute":
            for layer, _off, dur, _n in rec.get("layers", []):
                self._step_layers[layer] = self._step_layers.get(layer, 0) + int(dur)
            labels = self._labels.get((int(rec.get("ctx", 1)), int(rec.get("graph", 0))))
            if labels:
                for op in rec.get("ops", []):
                    if 0 <= op[0] < len(labels):
                        lab = labels[op[0]]
                        self._step_ops[lab] = self._step_ops.get(lab, 0) + int(op[2])
        elif t == "step_end":
            begin = self._begin.pop((int(rec.get("ctx", 1)), int(rec["step"])), {})
            kind = str(begin.get("kind", "gen"))
            v = StepView(
                step=int(rec["step"]),
                kind=kind,
                n_tokens=int(rec.get("n_tokens", 0)),
                dur_ns=int(rec.get("dur", 0)),
                kv_used=int(rec.get("kv_used", -1)),
                request=begin.get("request"),
            )
            self.window.append(v)
            self._op_by_step.append(self._step_ops)
            if self._step_layers:
                self.last_layers = self._step_layers
            self.steps_done += 1
            if kind == "prompt":
                self.prompt_tokens += v.n_tokens
            else:
                self.gen_tokens += v.n_tokens
            return v
        elif t == "session_end":
            self.status = str(rec.get("status", "ended"))
        return None

    def gen_tok_s(self) -> float:
        gen = [s for s in self.window if s.kind == "gen"]
        ns = sum(s.dur_ns for s in gen)
        return sum(s.n_tokens for s in gen) / (ns / 1e9) if ns else 0.0

    def step_ms_percentiles(self) -> tuple[float, float, float]:
        durs = sorted(s.dur_ns / 1e6 for s in self.window if s.kind == "gen")
        if not durs:
            return (0.0, 0.0, 0.0)

        def q(p: float) -> float:
            return durs[min(len(durs) - 1, int(p * (len(durs) - 1) + 0.5))]

        return q(0.5), q(0.9), q(0.99)

    def top_ops(self, n: int = 8) -> list[tuple[str, int]]:
        total: dict[str, int] = {}
        for d in self._op_by_step:
            for k, v in d.items():
                total[k] = total.get(k, 0) + v
        return sorted(total.items(), key=lambda kv: -kv[1])[:n]

    def kv_used(self) -> int:
        return self.window[-1].kv_used if self.window else 0

    def line(self, v: StepView) -> str:
        """The plain one-line form of a completed step (non-terminal output)."""
        p50, _, _ = self.step_ms_percentiles()
        req = f" request={v.request}" if v.request else ""
        return (
            f"step {v.step} {v.kind} tokens={v.n_tokens} ms={v.dur_ns / 1e6:.2f} "
            f"gen_tok_s={self.gen_tok_s():.1f} p50_ms={p50:.2f} kv={v.kv_used}{req}"
        )
