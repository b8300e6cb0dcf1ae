"""native.mtmd_memory's reading of mtmd_instr_memory_usage's answer, on a stand-in for libmtmd
(the real one: test_fit_mmproj): the devices and bytes it wrote, a second call with room for as
many as it measured past the first call's room (and no third), each failure one line."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import mtmd_memory

pytestmark = pytest.mark.fast


class Params(ctypes.Structure):
    _fields_ = [("warmup", ctypes.c_bool)]


class Measure:
    """mtmd_instr_memory_usage measuring ``n`` devices (device 0x1000 + i, 100 + i bytes), or
    returning ``n`` where it is negative; its calls' room and warmup kept."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, name: bytes, params: Any, devices: Any, sizes: Any, room: int) -> int:
        self.calls.append((room, bool(params._obj.warmup)))
        for i in range(min(max(self.n, 0), room)):
            devices[i] = 0x1000 + i
            sizes[i] = 100 + i
        return self.n


class Lib:
    def __init__(self, fn: Measure | None) -> None:
        if fn is not None:
            self.mtmd_instr_memory_usage = fn


class Mtmd:
    mtmd_context_params = Params

    def __init__(self, fn: Measure | None) -> None:
        self._libmtmd = Lib(fn)


def measured(n: int) -> list[tuple[int, int]]:
    return [(0x1000 + i, 100 + i) for i in range(n)]


@pytest.mark.parametrize("n, rooms", [(0, [16]), (3, [16]), (16, [16]), (17, [16, 17])])
def test_the_devices_measured_in_one_call_or_two(n: int, rooms: list[int]) -> None:
    fn = Measure(n)
    got = mtmd_memory.memory_usage(Mtmd(fn), Path("p.gguf"), Params(), warmup=True)
    assert sorted(got.items()) == measured(n)
    assert fn.calls == [(room, True) for room in rooms]


@pytest.mark.parametrize(
    "n, says",
    [
        (-1, "libmtmd's measure failed (mtmd_instr_memory_usage returned -1)"),
        (-2, "libmtmd's measure failed (mtmd_instr_memory_usage returned -2)"),
        (mtmd_memory.MAX_DEVICES + 1, "more than this reads"),
        (None, "this libmtmd has no mtmd_instr_memory_usage"),
    ],
)
def test_a_failure_is_one_line(n: int | None, says: str) -> None:
    fn = Measure(n) if n is not None else None
    with pytest.raises(UserError) as err:
        mtmd_memory.memory_usage(Mtmd(fn), Path("p.gguf"), Params(), warmup=False)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_count_that_grows_between_the_calls_is_refused() -> None:
    """A second answer past its room (the devices changed in between) is not asked a third time."""
    fn = Measure(17)
    calls = {"n": 0}

    def growing(*args: Any) -> int:
        calls["n"] += 1
        fn.n = 17 if calls["n"] == 1 else 18
        return fn(*args)

    with pytest.raises(UserError, match="more than this reads"):
        mtmd_memory.memory_usage(Mtmd(growing), Path("p.gguf"), Params(), warmup=False)  # type: ignore[arg-type]
    assert calls["n"] == 2
