"""``transfers`` records: the commands a run sent to its RPC servers, times made absolute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .fields import record_rows, strict_str, uint


class TransferRow(NamedTuple):
    """One command a client sent to an RPC server (a ``transfers`` row), times absolute: the device
    (-1: not in ggml's registry yet), the command, the tensor it moves (``""``: none), its tensor
    bytes, the bytes written and read, and when it was issued, began to be written, was written
    whole, and its reply was read whole (``sent_at`` for a command without a reply)."""

    device: int
    cmd: str
    tensor: str
    bytes: int
    sent: int
    recv: int
    queue: int
    start: int
    sent_at: int
    end: int


@dataclass
class Transfers:
    """A ``transfers`` record: its phase (``load``, ``step``, ``between``), the step for phase
    ``step``, the commands not recorded, and its rows."""

    phase: str
    ctx: int | None
    step: int | None
    dropped: int
    rows: list[TransferRow]


_PHASES = ("load", "step", "between")


def transfers(rec: dict[str, Any]) -> Transfers:
    """A ``transfers`` record, times made absolute (strict, as ``placement``)."""
    phase = rec["phase"]
    if phase not in _PHASES:
        raise ValueError(f"unknown transfers phase {phase!r}")
    t0 = uint(rec["t_start"])
    rows = []
    for row in record_rows(rec, "rows", 10):
        d, cmd, tensor, nbytes, sent, recv, q, s, sa, e = row
        if (  # the common case, every check at once (else one by one, for the error's words)
            type(d) is int
            and type(cmd) is str
            and type(tensor) is str
            and type(nbytes) is int
            and type(sent) is int
            and type(recv) is int
            and type(q) is int
            and type(s) is int
            and type(sa) is int
            and type(e) is int
            and d >= -1
            and nbytes >= 0
            and sent >= 0
            and recv >= 0
            and 0 <= q <= s <= sa <= e
        ):
            rows.append(
                TransferRow(d, cmd, tensor, nbytes, sent, recv, t0 + q, t0 + s, t0 + sa, t0 + e)
            )
            continue
        q, s, sa, e = uint(q), uint(s), uint(sa), uint(e)
        if not q <= s <= sa <= e:
            raise ValueError("a transfer whose times are out of order")
        rows.append(
            TransferRow(
                uint(d, -1), strict_str(cmd), strict_str(tensor), uint(nbytes), uint(sent), uint(recv),
                t0 + q, t0 + s, t0 + sa, t0 + e,
            )
        )  # fmt: skip
    in_step = phase == "step"
    return Transfers(
        phase=phase,
        ctx=uint(rec["ctx"]) if in_step else None,
        step=uint(rec["step"]) if in_step else None,
        dropped=uint(rec.get("dropped", 0)),
        rows=rows,
    )
