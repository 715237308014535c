"""The committed JSON Schemas are exactly what the models export."""

from __future__ import annotations

import json
from pathlib import Path

from helmline.contracts import PAYLOAD_CLASSES, export_schemas

SCHEMA_DIR = Path(__file__).parents[1] / "schema"


def test_committed_schemas_match_the_models() -> None:
    exported = export_schemas()
    committed = {
        path.relative_to(SCHEMA_DIR).as_posix(): json.loads(path.read_text())
        for path in SCHEMA_DIR.rglob("*.json")
    }
    stale = sorted(set(committed) - set(exported))
    missing = sorted(set(exported) - set(committed))
    changed = sorted(
        name for name in exported if name in committed and committed[name] != exported[name]
    )
    hint = "the contracts changed without a re-export: run `make schema`"
    assert not missing, f"{hint}; missing: {missing}"
    assert not stale, f"{hint}; stale: {stale}"
    assert not changed, f"{hint}; changed: {changed}"


def test_every_event_type_has_a_documented_schema() -> None:
    exported = export_schemas()
    for payload_class in PAYLOAD_CLASSES:
        schema = exported[f"events/{payload_class.TYPE}.json"]
        assert schema["description"], payload_class.TYPE
        assert schema["properties"]["type"]["const"] == payload_class.TYPE
        data = schema["properties"]["data"]
        if "$ref" in data:
            data = schema["$defs"][data["$ref"].rsplit("/", 1)[-1]]
        assert data["description"] == schema["description"]
        for name, field in data["properties"].items():
            assert "description" in field, f"{payload_class.TYPE}.data.{name} has no docstring"
