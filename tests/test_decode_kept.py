"""The device decoders keep well-formed rows as read (``Placement.raw``, ``Transfers.raw``) and make
their tuples when first read: the same tuples, times made absolute by hand here, as the row-by-row
reading makes; a record with an odd value is still read row by row and skipped with its error."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import FIXTURES, read_log

from llamacpp_instr.converters.reading.decode import placement as devices
from llamacpp_instr.converters.reading.decode import transfers

pytestmark = pytest.mark.fast

LOGS = [
    FIXTURES / "tiny-llama-rpc2-detailed.log.gz",
    FIXTURES / "tiny-llama-vulkan-partial-detailed.log.gz",
    FIXTURES / "tiny-llama-vulkan-full-detailed.log.gz",
]


def _abs(rows: list[list[Any]], t0: int, times: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """The rows as tuples, the fields at ``times`` plus ``t0``."""
    return [tuple(v + t0 if k in times else v for k, v in enumerate(r)) for r in rows]


@pytest.mark.parametrize("path", LOGS, ids=[p.name.split("-detailed")[0] for p in LOGS])
def test_kept_rows_are_the_rows_read_one_by_one(path: Any) -> None:
    n_place = n_cmds = 0
    for rec in read_log(path):
        if rec["type"] == "compute":
            t0 = rec["t_start"]
            p = devices.placement(rec, t0)
            if p is None:
                continue
            assert p.raw is not None  # (kept as read)
            assert p.bulk() == (p.raw, t0)
            assert p.splits == _abs(rec.get("splits", []), t0, (3, 4, 5))
            assert p.copies == _abs(rec.get("copies", []), t0, (6,))
            assert p.busy == _abs(rec.get("busy", []), t0, (1,))
            assert p.remote == _abs(rec.get("remote", []), t0, (2, 3, 4, 5))
            assert [tuple(c) for c in p.clocks] == [tuple(c) for c in rec.get("clocks", [])]
            one_by_one = devices._strict(rec, t0)
            for name in ("splits", "copies", "busy", "remote", "clocks", "wait"):
                assert getattr(p, name) == getattr(one_by_one, name)
            assert p.split_keys() == tuple((r[0], r[1], r[2]) for r in rec.get("splits", []))
            n_place += 1
        elif rec["type"] == "transfers":
            t = transfers.transfers(rec)
            assert t.raw is rec["rows"]
            assert t.n_rows == len(rec["rows"])
            assert t.rows == _abs(rec["rows"], rec["t_start"], (6, 7, 8, 9))
            assert t.rows == transfers._strict_rows(rec, rec["t_start"])
            n_cmds += len(t.rows)
    assert n_place > 0
    if "rpc" in path.name:
        assert n_cmds > 0


def _first(path: Any, rtype: str, field: str) -> dict[str, Any]:
    return next(r for r in read_log(path) if r["type"] == rtype and r.get(field))


@pytest.mark.parametrize(
    "field, k, value, error",
    [
        ("splits", 0, True, "True is not an integer"),  # a bool is no device index
        ("copies", 6, -1, "-1 is not an integer >= 0"),
        ("remote", 3, 0, "ends before it starts"),
    ],
)
def test_an_odd_placement_row_is_read_one_by_one(
    field: str, k: int, value: Any, error: str
) -> None:
    rec = _first(LOGS[0], "compute", field)
    rec[field][-1][k] = value
    with pytest.raises((ValueError, TypeError), match=error):
        devices.placement(rec, rec["t_start"])


def test_an_odd_transfers_row_is_read_one_by_one() -> None:
    rec = _first(LOGS[0], "transfers", "rows")
    rec["rows"][-1] = rec["rows"][-1][:9]  # (short)
    with pytest.raises(ValueError, match="not a list of 10"):
        transfers.transfers(rec)
    rec = _first(LOGS[0], "transfers", "rows")
    rec["rows"][-1][9] = rec["rows"][-1][8] - 1
    with pytest.raises(ValueError, match="out of order"):
        transfers.transfers(rec)
