"""The log's contract is written twice, for two readers: ``contract/schema.py`` for the Python
that reads logs, ``contract/schema_vN.json`` (JSON Schema, the current version's) for anyone else. They must say the
same: the record types, the levels a session is recorded at, the schema version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llamacpp_instr.contract import schema

pytestmark = pytest.mark.fast

SCHEMA_JSON = Path(schema.__file__).with_name(f"schema_v{schema.CURRENT_SCHEMA_VERSION}.json")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return json.loads(SCHEMA_JSON.read_text())


def test_record_types_are_the_same_list(doc: dict[str, Any]) -> None:
    listed = doc["properties"]["type"]["enum"]
    assert len(listed) == len(set(listed)) and listed  # no type twice, and not vacuous
    assert set(listed) == schema.RECORD_TYPES_V1
    # each type has its own definition, chosen by its "type"
    chosen = {b["if"]["properties"]["type"]["const"]: b["then"]["$ref"] for b in doc["allOf"]}
    assert chosen == {t: f"#/$defs/{t}" for t in schema.RECORD_TYPES_V1}
    assert schema.RECORD_TYPES_V1 <= set(doc["$defs"])


def test_levels_and_version_are_the_same(doc: dict[str, Any]) -> None:
    start = doc["$defs"]["session_start"]["properties"]
    assert tuple(start["level"]["enum"]) == schema.SESSION_LEVELS
    assert start["schema_version"] == {"const": schema.CURRENT_SCHEMA_VERSION}
    assert SCHEMA_JSON.name == f"schema_v{schema.CURRENT_SCHEMA_VERSION}.json"
