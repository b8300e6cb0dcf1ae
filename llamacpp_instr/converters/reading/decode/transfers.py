"""``transfers`` records: the commands a run sent to its RPC servers, times made absolute."""

from __future__ import annotations

from functools import cached_property
from typing import Any, NamedTuple

from .fields import DECODED, record_rows, strict_str, uint


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


class Transfers:
    """A ``transfers`` record: its phase (``load``, ``step``, ``between``), the step for phase
    ``step``, the commands not recorded, and its rows (``TransferRow``, times absolute). A record
    whose rows are all well-formed keeps them as read (``raw``: times relative to ``t0``), and
    makes its ``TransferRow`` tuples only when ``rows`` is first read: the tables take the raw
    rows in bulk (``analysis.device_rows``), with no tuple per row."""

    def __init__(
        self,
        phase: str,
        ctx: int | None,
        step: int | None,
        dropped: int,
        rows: list[TransferRow] | None = None,
        *,
        raw: list[list[Any]] | None = None,
        t0: int = 0,
    ) -> None:
        self.phase, self.ctx, self.step, self.dropped = phase, ctx, step, dropped
        self.raw, self.t0 = (raw, t0) if rows is None else (None, 0)
        if rows is not None or raw is None:
            self.rows = rows if rows is not None else []

    # (made on first read, then an attribute of the instance: the trace writers read it often)
    @cached_property
    def rows(self) -> list[TransferRow]:
        t0 = self.t0
        return [
            TransferRow(d, cmd, tensor, nbytes, sent, recv, t0 + q, t0 + s, t0 + sa, t0 + e)
            for d, cmd, tensor, nbytes, sent, recv, q, s, sa, e in self.raw or ()
        ]

    @property
    def n_rows(self) -> int:
        return len(self.raw) if self.raw is not None else len(self.rows)

    def bulk_rows(self) -> tuple[list[Any], int]:
        """The rows as ``TransferRow``'s fields, their times relative to the returned offset:
        the raw rows and ``t0`` when kept, else the tuples and 0."""
        if self.raw is not None:
            return self.raw, self.t0
        return self.rows, 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Transfers):
            return NotImplemented
        return (self.phase, self.ctx, self.step, self.dropped, self.rows) == (
            other.phase, other.ctx, other.step, other.dropped, other.rows
        )  # fmt: skip

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Transfers(phase={self.phase!r}, ctx={self.ctx!r}, step={self.step!r}, "
            f"dropped={self.dropped!r}, rows={self.rows!r})"
        )


_PHASES = ("load", "step", "between")
# the writer's bounds: rows per record (ROWS_PER_REC in src/llama-instr-rpc.cpp), a command's
# name (ggml-rpc's, lower case), a tensor's name (GGML_MAX_NAME: 63 bytes and the terminator)
ROWS_MAX = 4096
CMD_MAX = 32
NAME_MAX = 63


def transfers(rec: dict[str, Any]) -> Transfers:
    """A ``transfers`` record, times made absolute (strict, as ``placement``)."""
    pre = rec.get(DECODED)
    if type(pre) is Transfers:  # (decoded by the forked reader)
        return pre
    phase = rec["phase"]
    if phase not in _PHASES:
        raise ValueError(f"unknown transfers phase {phase!r}")
    t0 = uint(rec["t_start"])
    raw = rec.get("rows")
    if type(raw) is list and len(raw) > ROWS_MAX:
        raise ValueError(f"a transfers record of {len(raw)} rows (at most {ROWS_MAX})")
    rows = None if type(raw) is list and _good_rows(raw) else _strict_rows(rec, t0)
    in_step = phase == "step"
    return Transfers(
        phase=phase,
        ctx=uint(rec["ctx"]) if in_step else None,
        step=uint(rec["step"]) if in_step else None,
        dropped=uint(rec.get("dropped", 0)),
        rows=rows,
        raw=raw,
        t0=t0,
    )


def _good_rows(raw: list[Any]) -> bool:
    """Whether every row is well-formed (never raises: ``_strict_rows`` says what is wrong)."""
    try:
        for d, cmd, tensor, nbytes, sent, recv, q, s, sa, e in raw:
            if not (  # every check at once
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
                and len(cmd) <= CMD_MAX
                and len(tensor) <= NAME_MAX
                and d >= -1
                and nbytes >= 0
                and sent >= 0
                and recv >= 0
                and 0 <= q <= s <= sa <= e
            ):
                return False
    except (TypeError, ValueError):  # (a row that is not a list of 10)
        return False
    return True


def _strict_rows(rec: dict[str, Any], t0: int) -> list[TransferRow]:
    """The rows field by field, for the error's words (a row not a list of 10, a value of
    another type or out of range raises)."""
    rows = []
    for d, cmd, tensor, nbytes, sent, recv, q, s, sa, e in record_rows(rec, "rows", 10):
        q, s, sa, e = uint(q), uint(s), uint(sa), uint(e)
        if not q <= s <= sa <= e:
            raise ValueError("a transfer whose times are out of order")
        if len(strict_str(cmd)) > CMD_MAX or len(strict_str(tensor)) > NAME_MAX:
            raise ValueError("a transfer's command or tensor name longer than the writer's")
        rows.append(
            TransferRow(
                uint(d, -1), strict_str(cmd), strict_str(tensor), uint(nbytes), uint(sent), uint(recv),
                t0 + q, t0 + s, t0 + sa, t0 + e,
            )
        )  # fmt: skip
    return rows
