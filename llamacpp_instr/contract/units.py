"""How a number of bytes reads, the one way every report, message and trace name writes it.

Binary units, as the sizes a user gives are read (``--memory CPU=2G``, a memory budget's
``512M``: powers of 1024) and as llama.cpp prints its buffers (MiB).
"""

from __future__ import annotations

import math
from typing import Any

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: Any, unit: str | None = None) -> str:
    """``n`` bytes in the largest unit under 1024 of it (1.5 MiB; bytes whole: 512 B), or in
    ``unit`` (one of ``UNITS``: a column of figures read against each other, 1,536.0 MiB); an en
    dash for no value (None, NaN), as the reports show one."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    x = float(n)
    for name in UNITS:
        if name == unit or (unit is None and (abs(x) < 1024 or name == UNITS[-1])):
            return f"{x:,.0f} {name}" if name == "B" else f"{x:,.1f} {name}"
        x /= 1024
    raise ValueError(f"unknown unit {unit!r}: one of {', '.join(UNITS)}")
