"""Step records: ``Step``, and what step_begin, step_end and topk records say of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .computes import Compute
from .fields import nonneg
from .media import Encode
from .memory import StepMemory, step_memory
from .transfers import Transfers


@dataclass
class Step:
    index: int
    ctx: int
    kind: str  # "prompt", "gen", or "encode" (an encoder's: its graph outside llama_decode)
    n_tokens: int
    pos: tuple[int, int]
    start: int
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    request: str | None = None  # the request it served (instr serve)
    seqs: list[tuple[int, int, int, int]] = field(default_factory=list)  # seq, n_tokens, pos0, pos1
    level: str = ""  # the level it was recorded at (sampling: minimal or the session's)
    dur: int = 0
    status: int | None = None
    n_outputs: int = 0
    kv_used: int = -1
    computes: list[Compute] = field(default_factory=list)
    topk: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    # the commands sent to RPC servers during the step (``transfers`` records of phase ``step``)
    transfers: list[Transfers] = field(default_factory=list)
    memory: StepMemory | None = None  # its memory figures (step_end.memory)
    # a mixture of experts' routing, per compute (``experts`` records: session.expert_routing.Routing)
    experts: list[Any] = field(default_factory=list)
    # images and sounds: an encode's medium slices, (media, slice) each; a decode step's medium
    # whose embeddings it decodes (one pair); () for the rest
    media: tuple[tuple[int, int], ...] = ()
    encode: Encode | None = None  # an encode's target and ``first`` (kind "encode")

    @property
    def end(self) -> int:
        return self.start + self.dur

    @property
    def op_time(self) -> int:
        return sum(c.op_time for c in self.computes)


def step_kind(rec: dict[str, Any]) -> str:
    """A step_begin's kind: ``gen``, ``encode``, or ``prompt`` (any other)."""
    kind = rec["kind"]
    return kind if kind in ("gen", "encode") else "prompt"


def step_level(rec: dict[str, Any], session_level: str) -> str:
    """The level a step_begin says it was recorded at; the session's in logs from before steps
    said it."""
    level = rec.get("level")
    return str(level) if isinstance(level, str) else session_level


def request_id(rec: dict[str, Any]) -> str | None:
    r = rec.get("request")
    return str(r) if r is not None else None


def step_seqs(rec: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """step_begin.seqs: [seq, n_tokens, first pos, last pos] per sequence (well-formed rows)."""
    out = []
    for row in rec.get("seqs") or []:
        if isinstance(row, list) and len(row) == 4:
            out.append((int(row[0]), int(row[1]), int(row[2]), int(row[3])))
    return out


def topk_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A topk record's well-formed rows."""
    return [
        r
        for r in rec["rows"]
        if isinstance(r, dict)
        and isinstance(r.get("ids"), list)
        and isinstance(r.get("logits"), list)
        and r["ids"]
        and r["logits"]
    ]


def end_step(step: Any, rec: dict[str, Any]) -> None:
    """What a step_end record says of its step (a ``Step``, or the bulk reader's own kind)."""
    step.start = nonneg(rec["t_start"])
    step.dur = nonneg(rec["dur"])
    step.status = int(rec["status"])
    step.n_outputs = int(rec["n_outputs"])
    step.kv_used = int(rec["kv_used"])
    step.memory = step_memory(rec)
    step.ended = True
