"""JSON Schema of every event as it travels on the wire, for other teams to depend on."""

from __future__ import annotations

from functools import cache
from typing import Any

from helmline.contracts._catalogue import Payload
from helmline.contracts._deadletters import DeadLetter
from helmline.contracts._envelope import Event
from helmline.contracts._versions import event_type_of, payload_classes

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


@cache
def _envelope_attributes() -> tuple[dict[str, Any], list[str]]:
    schema = Event.model_json_schema(mode="serialization")
    properties = {name: spec for name, spec in schema["properties"].items() if name != "data"}
    return properties, list(schema["required"])


def event_schema(payload_class: type[Payload]) -> dict[str, Any]:
    """The JSON Schema of one event type: the CloudEvents envelope with its typed `data`."""
    event_type = event_type_of(payload_class)
    version = payload_class.SCHEMA_VERSION
    data = payload_class.model_json_schema(mode="serialization")
    definitions = data.pop("$defs", {})
    data["properties"].pop("type")
    data["required"] = [name for name in data.get("required", []) if name != "type"]
    attributes, required = _envelope_attributes()
    properties = {
        **attributes,
        "type": {**attributes["type"], "const": event_type},
        "schemaversion": {**attributes["schemaversion"], "const": version},
        "data": data,
    }
    schema: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:helmline:event:{event_type}:v{version}",
        "title": event_type,
        "description": (payload_class.__doc__ or "").strip(),
        "type": "object",
        "properties": properties,
        "required": sorted({*required, "data"}),
        "additionalProperties": False,
    }
    if definitions:
        schema["$defs"] = definitions
    return schema


def export_schemas() -> dict[str, dict[str, Any]]:
    """Every exported schema by file name: one per event type, the dead letter and an index."""
    files: dict[str, dict[str, Any]] = {}
    index: list[dict[str, Any]] = []
    for payload_class in payload_classes():
        event_type = event_type_of(payload_class)
        files[f"events/{event_type}.json"] = event_schema(payload_class)
        index.append({"type": event_type, "schemaversion": payload_class.SCHEMA_VERSION,
                      "schema": f"events/{event_type}.json",
                      "description": (payload_class.__doc__ or "").strip()})
    dead_letter = DeadLetter.model_json_schema(mode="serialization")
    files["dead-letter.json"] = {"$schema": JSON_SCHEMA_DIALECT,
                                 "$id": "urn:helmline:dead-letter:v1", **dead_letter}
    files["index.json"] = {"title": "Helmline event catalogue", "events": index}
    return files
