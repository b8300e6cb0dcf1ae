"""The objects alive before ``load_sessions`` reads a log, set aside from the cyclic collector
while it reads it (``gc.freeze``; ``instr to-perfetto`` tunes the collector for itself:
``commands.to_perfetto``).

Parsing a compute record makes hundreds of lists at once (one per op), so reading a log runs
the collector's youngest generation about once per record, and a device log's bigger records
(splits, copies, remote graphs...) run it often enough to trigger a full collection every few
hundred steps. A full collection walks every tracked object of the process, pandas' and numpy's
modules included: on the 200k-op SmolLM2 device logs 30-70 ms of a 200-300 ms read, a cost the
CPU log escaped by staying under the threshold. With the older objects frozen, a full collection
walks only what the reading made, and they rejoin the collector's oldest generation when it ends
(``gc.unfreeze``), none of them lost to it. Left alone when the program has frozen objects of
its own (its ``gc.freeze`` is not ours to undo)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # readings under way (nested, or interleaved generators)
_ours = False  # whether the frozen objects are ours to unfreeze when the last reading ends


@contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Freeze the objects alive now for the time of the block (see the module doc)."""
    global _depth, _ours
    with _lock:
        if _depth == 0:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _ours:
                gc.unfreeze()
                _ours = False
