"""Where the values of a compute's ``layers`` rows lie in the rows' flat list, by row widths.

A device log's layer spans are rows of five (a span a device timed, naming it) and of four (the
CPU backend's), mixed. Their widths are structure, the same every step of a graph, so what says
where each column lies (``MixedRows``: index arrays for numpy and getters for the checks) is made
once per widths and kept, and a compute's rows are packed through one flat list with no list made
per row (``columns.layer_rows``)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from operator import itemgetter
from typing import Any

import numpy as np

Getter = Callable[[list[Any]], tuple[Any, ...]]


def getter(positions: list[int]) -> Getter:
    """``itemgetter(*positions)``, a tuple of one for one position (as ``itemgetter`` of several
    gives a tuple)."""
    if len(positions) == 1:
        k = positions[0]
        return lambda flat: (flat[k],)
    return itemgetter(*positions)


class MixedRows:
    """Rows of four and five elements, by where they lie in their flat list followed by one -1:
    ``at4`` the positions of each row's first four values (layer, start, dur, n_ops), ``at5``
    those and its device, ``device_at`` the position of its device (the -1 for a row of four),
    and getters of the starts, durations and named devices (as tuples)."""

    __slots__ = ("at4", "at5", "device_at", "starts", "durs", "devices")

    def __init__(self, widths: tuple[int, ...]) -> None:
        offsets = list(accumulate(widths, initial=0))
        n = offsets.pop()  # (the appended -1's position)
        first4 = np.array(offsets, np.intp)[:, None] + np.arange(4, dtype=np.intp)
        self.device_at = np.array(
            [o + 4 if w == 5 else n for o, w in zip(offsets, widths, strict=True)], np.intp
        )
        self.at4 = first4.ravel()
        self.at5 = np.concatenate([first4, self.device_at[:, None]], axis=1).ravel()
        self.starts = getter([o + 1 for o in offsets])
        self.durs = getter([o + 2 for o in offsets])
        self.devices = getter([o + 4 for o, w in zip(offsets, widths, strict=True) if w == 5])


FOUR = MixedRows((5,))  # (stands for rows all of four: ``columns`` packs those by slices)
_KNOWN: dict[tuple[int, ...], MixedRows | None] = {}
_KNOWN_MAX = 64  # (a run has a few graphs; beyond this, begun again)


def mixed_rows(widths: tuple[int, ...]) -> MixedRows | None:
    """The ``MixedRows`` of rows of these widths; ``FOUR`` when they are all four; None when a
    width is neither four nor five (refused)."""
    try:
        return _KNOWN[widths]
    except KeyError:
        pass
    kinds = set(widths)
    got: MixedRows | None = None
    if kinds == {4}:
        got = FOUR
    elif widths and kinds <= {4, 5}:
        got = MixedRows(widths)
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[widths] = got
    return got
