"""JSON Schema of every event as it travels on the wire, for other teams to depend on."""

from __future__ import annotations

import inspect
from typing import Any

from helmline.contracts._asyncapi import asyncapi_document
from helmline.contracts._deadletters import DeadLetter
from helmline.contracts._envelope import EVENT_CLASSES
from helmline.contracts._payload import Payload

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
CATALOGUE_VERSION = "1.3.0"
"""Version of the published catalogue: minor for new types or versions, major never."""


def event_schema(payload_class: type[Payload]) -> dict[str, Any]:
    """The JSON Schema of one event type: the CloudEvents envelope with its typed `data`."""
    schema = EVENT_CLASSES[payload_class].model_json_schema(by_alias=True)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:helmline:event:{payload_class.TYPE}:v{payload_class.SCHEMA_VERSION}",
        **schema,
        "title": payload_class.TYPE,
        "description": inspect.cleandoc(payload_class.__doc__ or ""),
    }


def export_schemas() -> dict[str, dict[str, Any]]:
    """Every exported schema by file name: one per event type, the dead letter and an index."""
    files: dict[str, dict[str, Any]] = {}
    index: list[dict[str, Any]] = []
    for payload_class in EVENT_CLASSES:
        file_name = f"events/{payload_class.TYPE}.json"
        files[file_name] = event_schema(payload_class)
        index.append(
            {
                "type": payload_class.TYPE,
                "schemaversion": payload_class.SCHEMA_VERSION,
                "schema": file_name,
                "description": inspect.cleandoc(payload_class.__doc__ or ""),
            }
        )
    files["dead-letter.json"] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": "urn:helmline:dead-letter:v1",
        **DeadLetter.model_json_schema(by_alias=True),
    }
    files["index.json"] = {"title": "Helmline event catalogue", "events": index}
    files["asyncapi.json"] = asyncapi_document(CATALOGUE_VERSION)
    return files
