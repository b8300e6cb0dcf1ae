"""The one byte formatter (``contract.units.fmt_bytes``): binary units, as sizes are given."""

from __future__ import annotations

import math

import pytest

from llamacpp_instr.contract.units import fmt_bytes

pytestmark = pytest.mark.fast


def test_bytes_read_in_the_largest_binary_unit_under_1024() -> None:
    cases = {
        0: "0 B",
        1023: "1,023 B",
        1024: "1.0 KiB",
        1536: "1.5 KiB",
        5 << 20: "5.0 MiB",
        3 * (1 << 30) // 2: "1.5 GiB",
        2 << 40: "2.0 TiB",
        3 << 50: "3,072.0 TiB",  # no unit above TiB
        -2048: "-2.0 KiB",
    }
    for n, text in cases.items():
        assert fmt_bytes(n) == text, n


def test_a_unit_given_holds_a_column_of_figures_read_together() -> None:
    assert fmt_bytes(1536 << 20, "MiB") == "1,536.0 MiB"
    assert fmt_bytes(100 << 10, "MiB") == f"{100 / 1024:.1f} MiB"
    assert fmt_bytes(7, "B") == "7 B"


def test_no_value_is_a_dash() -> None:
    assert fmt_bytes(None) == fmt_bytes(math.nan) == fmt_bytes(None, "MiB") == "–"
