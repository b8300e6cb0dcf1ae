"""The checks every decoder shares, and what a record that lacks the schema's shape raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

from ..reader import ReadReport

# The key under which the forked log reader (``reading.prefetch``) leaves a record's decoded form
# (``Placement``, ``Transfers``) where it decoded it there, as decoding it here would: a decoder
# takes it only if it is of its own type, which no value read from a log is.
DECODED = "\0decoded"


# the bound of every count, time, offset and duration a log holds (ns: 146 years): a start plus
# an offset plus a duration stays within 64 bits, as a trace's timestamps must
VALUE_MAX = 1 << 62


def nonneg(v: Any) -> int:
    """A non-negative integer below VALUE_MAX (timestamps, offsets, durations), else
    ValueError."""
    x = int(v)
    if x < 0:
        raise ValueError(f"negative time value {x}")
    if x >= VALUE_MAX:
        raise ValueError(f"value {x} is beyond 2**62")
    return x


def uint(v: Any, lo: int = 0) -> int:
    """A JSON integer (not a bool, float or string) of at least ``lo`` and below VALUE_MAX, else
    ValueError: the fields that name devices and places in a compute (read strictly: they index
    tables)."""
    if type(v) is not int or v < lo or v >= VALUE_MAX:
        raise ValueError(f"{v!r} is not an integer >= {lo} and below 2**62")
    return v


def opt_count(v: Any) -> int | None:
    """None, or a JSON integer from 0 to below VALUE_MAX (a request's times and counts), else
    ValueError or TypeError."""
    if v is None:
        return None
    if type(v) is not int:
        raise TypeError(f"{v!r} is not an integer")
    if not 0 <= v < VALUE_MAX:
        raise ValueError(f"{v} is not from 0 to 2**62")
    return v


def as_dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def record_rows(rec: dict[str, Any], key: str, width: int) -> list[list[Any]]:
    """A compute record's ``key`` rows, each a list of ``width`` values ([] when absent)."""
    raw = rec.get(key)
    if raw is None:
        return []
    if type(raw) is not list:
        raise TypeError(f"{key} is not a list")
    for row in raw:
        if type(row) is not list or len(row) != width:
            raise ValueError(f"a {key} row is not a list of {width} values")
    return raw


def strict_str(v: Any) -> str:
    if type(v) is not str:
        raise TypeError(f"{v!r} is not a string")
    return v


# what applying a record that parses but does not have the schema's shape raises
MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def skip_malformed(
    path: Path | str, n: int, rec: dict[str, Any], exc: Exception, strict: bool, rep: ReadReport
) -> None:
    """Line ``n`` held such a record: an error with ``strict``, else skipped like bad JSON."""
    why = f"malformed {rec.get('type')} record ({type(exc).__name__}: {exc})"
    if strict:
        raise UserError(f"{path}: line {n}: {why}") from None
    rep.skipped.append((n, why))
