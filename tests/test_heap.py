"""analysis.heap: the objects alive before a reading are frozen for its time, then given back to
the collector; a program's own frozen objects are left frozen."""

from __future__ import annotations

import gc

import pytest

from llamacpp_instr.converters.analysis.heap import older_objects_frozen

pytestmark = pytest.mark.fast


def test_frozen_for_the_reading_then_given_back() -> None:
    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with older_objects_frozen():  # nested: the same objects, none unfrozen at its end
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_interleaved_readings_unfreeze_once_both_end() -> None:
    a, b = older_objects_frozen(), older_objects_frozen()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert gc.get_freeze_count() > 0  # b still reads
    b.__exit__(None, None, None)
    assert gc.get_freeze_count() == 0


def test_an_exception_still_unfreezes() -> None:
    try:
        with older_objects_frozen():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0


def test_a_programs_own_freeze_is_left_alone() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with older_objects_frozen():
            pass
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()
