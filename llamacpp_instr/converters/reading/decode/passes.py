"""``Pass``: what every kind of compute holds, from its ``step_begin`` to its ``step_end``.

A context computes its graphs in passes, each begun by a ``step_begin`` and ended by a
``step_end`` with its computes, commands and memory between: a language model's decode step
(``steps.Step``) and an encoder's encode of an image's or a sound's slices (``media.Encode``) are
two kinds. The fold opens one per ``step_begin`` (its kind's own type) and hands it out as its
kind's own event when it ends; what reads any kind (the computes' layout, their device time)
takes a ``Pass``, and what reads one kind takes that kind's type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .computes import Compute
from .fields import nonneg
from .memory import StepMemory, step_memory
from .transfers import Transfers


@dataclass(kw_only=True)
class Pass:
    index: int  # its step_begin's ``step``
    ctx: int
    n_tokens: int  # the tokens it decoded, or the embeddings it made
    pos: tuple[int, int]
    start: int
    request: str | None = None  # the request it served (instr serve, llama-server)
    level: str = ""  # the level it was recorded at (sampling: minimal or the session's)
    dur: int = 0
    status: int | None = None
    n_outputs: int = 0
    kv_used: int = -1
    computes: list[Compute] = field(default_factory=list)
    ended: bool = False
    # the commands sent to RPC servers during it (``transfers`` records of phase ``step``)
    transfers: list[Transfers] = field(default_factory=list)
    memory: StepMemory | None = None  # its memory figures (step_end.memory)
    # a mixture of experts' routing, per compute (``experts`` records: session.expert_routing.Routing)
    experts: list[Any] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.dur

    @property
    def op_time(self) -> int:
        return sum(c.op_time for c in self.computes)


def begun(rec: dict[str, Any], session_level: str) -> dict[str, Any]:
    """What any step_begin says of its pass (a ``Pass``'s fields, as keyword arguments)."""
    return {
        "index": int(rec["step"]),
        "ctx": int(rec["ctx"]),
        "n_tokens": int(rec["n_tokens"]),
        "pos": (int(rec["pos"][0]), int(rec["pos"][1])),
        "start": nonneg(rec["ts"]),
        "request": request_id(rec),
        "level": step_level(rec, session_level),
    }


def step_level(rec: dict[str, Any], session_level: str) -> str:
    """The level a step_begin says it was recorded at; the session's in logs from before steps
    said it."""
    level = rec.get("level")
    return str(level) if isinstance(level, str) else session_level


def request_id(rec: dict[str, Any]) -> str | None:
    r = rec.get("request")
    return str(r) if r is not None else None


def end_step(p: Pass, rec: dict[str, Any]) -> None:
    """What a step_end record says of its pass."""
    p.start = nonneg(rec["t_start"])
    p.dur = nonneg(rec["dur"])
    p.status = int(rec["status"])
    p.n_outputs = int(rec["n_outputs"])
    p.kv_used = int(rec["kv_used"])
    p.memory = step_memory(rec)
    p.ended = True
