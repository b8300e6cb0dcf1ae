"""What the live view of a log being written shows (``instr follow``, ``instr run --live``).

``LiveState`` feeds the records ``reading.tail`` follows to the session fold one at a time and
keeps only what the view shows, over a window of recent steps: memory does not grow with the run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..reading.decode.computes import op_time_by_label
from ..reading.decode.fields import MALFORMED
from ..reading.decode.media import Encode
from ..reading.decode.sessions import (
    EncodeDone,
    SessionEnded,
    SessionInfo,
    SessionStarted,
    StepDone,
)
from ..reading.decode.steps import Step
from ..session.fold import Fold

WINDOW = 64  # steps the statistics cover


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
    """What the live view shows, updated record by record through the session fold
    (``session.fold.Fold``): the same decoding as every converter, over a bounded window."""

    model: str = ""
    level: str = ""
    sid: str = ""
    memory: dict[str, int] = field(default_factory=dict)
    n_layer: int = 0
    status: str = "running"
    steps_done: int = 0
    prompt_tokens: int = 0
    gen_tokens: int = 0
    # an encoder's encodes (images, sounds): counted apart, never in the decode figures
    encodes_done: int = 0
    encode_ns: int = 0
    window: deque[StepView] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # layer -> ns in the last step's computes
    last_layers: dict[int, int] = field(default_factory=dict)
    # op label -> ns over the window's steps (decayed by dropping old steps' contributions)
    _op_by_step: deque[dict[str, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # graph ids are per session: keep the last few tables only
    fold: Fold = field(default_factory=lambda: Fold(keep_graphs=16))

    def add(self, rec: dict[str, Any]) -> StepView | None:
        """Apply one record; returns the step it completed, if any. A record without the schema's
        shape is skipped, as the converters skip it."""
        done = None
        try:
            for ev in self.fold.add(rec):
                if isinstance(ev, SessionStarted):
                    self._start(ev.session)
                elif isinstance(ev, StepDone) and ev.step.ended:
                    done = self._step(ev.step)
                elif isinstance(ev, EncodeDone) and ev.encode.ended:
                    done = self._encode(ev.encode)
                elif isinstance(ev, SessionEnded) and ev.session.end is not None:
                    self.status = str(ev.session.end.get("status", "ended"))
        except MALFORMED:
            pass
        return done

    def _start(self, info: SessionInfo) -> None:
        m = info.model
        self.model = str(m.get("name") or m.get("architecture") or "")
        self.n_layer = int(m.get("n_layer") or 0)
        self.level = info.level
        self.sid = info.sid
        self.memory = {k: v for k, v in info.memory.items() if k != "buffers"}

    def _encode(self, enc: Encode) -> StepView:
        """An encoder's encode: its line, counted apart, in no decode figure."""
        self.encodes_done += 1
        self.encode_ns += enc.dur
        return StepView(enc.index, "encode", enc.n_tokens, enc.dur, enc.kv_used)

    def _step(self, step: Step) -> StepView:
        layers: dict[int, int] = {}
        ops: dict[str, int] = {}
        for c in step.computes:
            for lay in c.layers:
                layers[lay.layer] = layers.get(lay.layer, 0) + lay.dur
            for label, ns in op_time_by_label(c).items():
                ops[label] = ops.get(label, 0) + ns
        v = StepView(
            step=step.index,
            kind=step.kind,
            n_tokens=step.n_tokens,
            dur_ns=step.dur,
            kv_used=step.kv_used,
            request=step.request,
        )
        self.window.append(v)
        self._op_by_step.append(ops)
        if layers:
            self.last_layers = layers
        self.steps_done += 1
        if step.kind == "prompt":
            self.prompt_tokens += v.n_tokens
        elif step.kind == "gen":
            self.gen_tokens += v.n_tokens
        return v

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
