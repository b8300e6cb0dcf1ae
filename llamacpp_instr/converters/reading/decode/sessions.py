"""session_start records (``SessionInfo``), and the events a fold of a log yields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import as_dict, nonneg
from .memory import Allocation
from .steps import Step
from .transfers import Transfers


@dataclass
class SessionInfo:
    """Everything session_start says, plus what the end says once known."""

    sid: str
    start_ts: int
    wall_time: str
    level: str
    schema_version: int
    producer: dict[str, Any]
    metadata: dict[str, Any]
    model: dict[str, Any]
    context: dict[str, Any]
    weights: list[dict[str, Any]]
    memory: dict[str, Any]
    end: dict[str, Any] | None = None
    last_ts: int = 0
    # `request` records (instr serve), in log order
    requests: list[dict[str, Any]] = field(default_factory=list)
    # `part` records (llama-bench's tests), in log order
    parts: list[dict[str, Any]] = field(default_factory=list)
    # `transfers` records outside any step (the model's upload: ``load``; ``between``), in log
    # order (a step's own are its ``Step.transfers``)
    transfers: list[Transfers] = field(default_factory=list)
    # the machine that made the log (CPU model, devices), {} in logs from before it was recorded
    machine: dict[str, Any] = field(default_factory=dict)
    # always on: sampling ({"steps": N, "requests": M}, {} when every step is recorded at the
    # level), rotation ({"max_bytes", "keep"}); a rotated log read alone or from a later file
    # says which file of the session it starts at (0: the first), and how many files were read
    sample: dict[str, Any] = field(default_factory=dict)
    rotate: dict[str, Any] = field(default_factory=dict)
    first_file: int = 0
    files: int = 1
    # every backend buffer the log saw, by id in the order made (memory_alloc, with memory_free's
    # time once freed), and the allocations that failed (memory_alloc_failed's fields)
    allocations: dict[int, Allocation] = field(default_factory=dict)
    memory_failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.end is not None

    @property
    def title(self) -> str:
        name = str(self.model.get("name") or self.model.get("architecture") or "model")
        ftype = str(self.model.get("file_type", ""))
        return f"{name} {ftype} [{self.sid}]".replace("  ", " ")


@dataclass
class SessionStarted:
    session: SessionInfo


@dataclass
class StepDone:
    session: SessionInfo
    step: Step


@dataclass
class SessionEnded:
    session: SessionInfo


Event = SessionStarted | StepDone | SessionEnded


def session_info(rec: dict[str, Any]) -> SessionInfo:
    memory = as_dict(rec.get("memory"))
    return SessionInfo(
        sid=str(rec["sid"]),
        start_ts=nonneg(rec["ts"]),
        wall_time=str(rec.get("wall_time", "")),
        level=str(rec.get("level", "")),
        schema_version=int(rec.get("schema_version", 1)),
        producer=as_dict(rec.get("producer")),
        metadata=as_dict(rec.get("metadata")),
        model=as_dict(rec.get("model")),
        context=as_dict(rec.get("context")),
        weights=[w for w in rec.get("weights", []) if isinstance(w, dict)],
        # totals must be numbers; per-buffer rows are kept as given
        memory={k: (int(v) if k != "buffers" else v) for k, v in memory.items()},
        last_ts=nonneg(rec["ts"]),
        machine=as_dict(rec.get("machine")),
        sample=as_dict(rec.get("sample")),
        rotate=as_dict(rec.get("rotate")),
        first_file=int(as_dict(rec.get("file")).get("index", 0)),
    )
