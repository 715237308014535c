"""The subscribers' contract: every event has a channel, a message and a valid example."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from helmline.contracts import (
    EXAMPLE_PAYLOADS,
    PAYLOAD_CLASSES,
    RETENTION_SUBJECT,
    TOOL_REGISTRY_SUBJECT,
    ApiKeyCreated,
    ApiKeyRevoked,
    ApiKeyRotated,
    McpInstanceStarted,
    McpInstanceStopped,
    Payload,
    StreamLimitApproaching,
    ToolCircuitChanged,
    ToolDefinitionAccepted,
    ToolDefinitionChanged,
    ToolDefinitionPinned,
    ToolRegistryPublished,
    ToolServerHealthChanged,
    api_key_subject,
    circuit_subject,
    decode_event,
    event_subject,
    export_schemas,
    mcp_instance_subject,
    server_health_subject,
    tool_definition_subject,
)

OFF_THE_LOG: dict[type[Payload], str] = {
    ToolRegistryPublished: TOOL_REGISTRY_SUBJECT,
    ToolCircuitChanged: circuit_subject("{server}"),
    ToolServerHealthChanged: server_health_subject("{server}"),
    ToolDefinitionPinned: tool_definition_subject("{tool}"),
    ToolDefinitionChanged: tool_definition_subject("{tool}"),
    ToolDefinitionAccepted: tool_definition_subject("{tool}"),
    McpInstanceStarted: mcp_instance_subject("{server}", "{tenant}", "{session}"),
    McpInstanceStopped: mcp_instance_subject("{server}", "{tenant}", "{session}"),
    StreamLimitApproaching: RETENTION_SUBJECT,
    ApiKeyCreated: api_key_subject("{tenant}", "{keyId}"),
    ApiKeyRotated: api_key_subject("{tenant}", "{keyId}"),
    ApiKeyRevoked: api_key_subject("{tenant}", "{keyId}"),
}


def test_every_event_type_has_an_example() -> None:
    assert [type(example) for example in EXAMPLE_PAYLOADS] == list(PAYLOAD_CLASSES)


def test_asyncapi_describes_every_event_with_an_example_valid_against_its_schema() -> None:
    files = export_schemas()
    document = files["asyncapi.json"]
    assert document["asyncapi"] == "3.0.0"
    for payload_class in PAYLOAD_CLASSES:
        channel = document["channels"][payload_class.TYPE]
        # Notices that belong to no session have subjects of their own; the rest are events
        # of a session.
        assert channel["address"] == OFF_THE_LOG.get(
            payload_class, event_subject("{tenant}", "{sessionId}", payload_class.TYPE)
        )
        message = document["components"]["messages"][payload_class.TYPE]
        schema_file = message["payload"]["$ref"]
        schema = files[schema_file]
        validator = Draft202012Validator(
            schema, registry=Registry().with_resource(schema["$id"], Resource.from_contents(schema))
        )
        (example,) = message["examples"]
        errors = [error.message for error in validator.iter_errors(example["payload"])]
        assert errors == [], f"{payload_class.TYPE}: {errors}"
        decoded = decode_event(json.dumps(example["payload"]))
        assert decoded.type == payload_class.TYPE
        assert document["operations"][f"receive.{payload_class.TYPE}"]["action"] == "receive"
