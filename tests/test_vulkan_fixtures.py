"""The committed Vulkan fixtures (tests/fixtures/make_fixtures.py, from the Vulkan build on
lavapipe) are complete real logs for the converters: no build is needed to read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, read_log

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name", ["full", "partial"])
def test_the_vulkan_fixtures_have_device_records(name: str, schema_validator: Any) -> None:
    records = read_log(FIXTURES / f"tiny-llama-vulkan-{name}-detailed.log.gz")
    for r in records:
        schema_validator.validate(r)
    devices = by_type(records, "session_start")[0]["machine"]["devices"]
    (vk,) = [d["index"] for d in devices if d["backend"] == "Vulkan"]
    assert records[-1]["type"] == "session_end" and records[-1]["totals"]["lost"] == 0
    computes = by_type(records, "compute")
    assert computes
    for c in computes:
        assert c["busy"] and {b[0] for b in c["busy"]} == {vk}
        assert c["clocks"][0][0] == vk
        assert any(len(s) == 5 and s[4] == vk for s in c["layers"])
        assert any(s[0] == vk for s in c["splits"])
        if name == "partial":
            assert len({s[0] for s in c["splits"]}) == 2 and c["copies"]
