"""The AsyncAPI 3 document of every subject and event, for teams that subscribe."""

from __future__ import annotations

import inspect
import json
from typing import Any

from helmline.contracts._envelope import encode_event
from helmline.contracts._examples import EXAMPLE_PAYLOADS, example_event
from helmline.contracts._payload import Payload
from helmline.contracts._topology import (
    SESSIONLESS_CHANNELS,
    Headers,
    dead_letter_subject,
    event_subject,
)

CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"


def _name(payload_class: type[Payload]) -> str:
    # AsyncAPI component keys must match ^[a-zA-Z0-9.\-_]+$; the type string does.
    return payload_class.TYPE


def _where(payload_class: type[Payload]) -> dict[str, Any]:
    """The channel's address and parameters: a session's subject, or for the few notices
    that belong to no session, the subject of their own stream."""
    channel = SESSIONLESS_CHANNELS.get(payload_class)
    if channel is None:
        return {
            "address": event_subject("{tenant}", "{sessionId}", payload_class.TYPE),
            "parameters": {name: _described_below(name) for name in ("tenant", "sessionId")},
        }
    where: dict[str, Any] = {"address": channel.address}
    if channel.parameters:
        where["parameters"] = {
            name: {"description": description} if description else _described_below(name)
            for name, description in channel.parameters.items()
        }
    return where


def _described_below(parameter: str) -> dict[str, str]:
    """A parameter the document's components describe once for every channel."""
    return {"$ref": f"#/components/parameters/{parameter}"}


def _message(example: Payload) -> dict[str, Any]:
    payload_class = type(example)
    return {
        "name": payload_class.TYPE,
        "title": payload_class.TYPE,
        "summary": inspect.cleandoc(payload_class.__doc__ or ""),
        "contentType": CONTENT_TYPE,
        "headers": {"$ref": "#/components/schemas/headers"},
        "payload": {"$ref": f"events/{payload_class.TYPE}.json"},
        "examples": [
            {
                "name": f"{payload_class.TYPE} example",
                "payload": json.loads(encode_event(example_event(example))),
            }
        ],
    }


def _channels() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The channels, operations and messages: one of each per event type, and dead letters."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for example in EXAMPLE_PAYLOADS:
        payload_class = type(example)
        name = _name(payload_class)
        channels[name] = {
            **_where(payload_class),
            "title": payload_class.TYPE,
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        operations[f"receive.{name}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{name}"},
            "summary": f"Receive {payload_class.TYPE} events.",
        }
        messages[name] = _message(example)
    channels["dead-letter"] = {
        "address": dead_letter_subject("{consumer}"),
        "title": "Dead letters",
        "description": "Messages a consumer gave up on, with the reason. Kept 30 days.",
        "parameters": {"consumer": {"description": "The durable consumer that gave up."}},
        "messages": {"dead-letter": {"$ref": "#/components/messages/dead-letter"}},
    }
    operations["receive.dead-letter"] = {
        "action": "receive",
        "channel": {"$ref": "#/channels/dead-letter"},
        "summary": "Receive dead letters.",
    }
    messages["dead-letter"] = {
        "name": "dead-letter",
        "contentType": "application/json",
        "payload": {"$ref": "dead-letter.json"},
    }
    return channels, operations, messages


_HEADERS = {
    "type": "object",
    "properties": {
        Headers.MSG_ID: {
            "type": "string",
            "description": "The event id; JetStream drops a re-published duplicate.",
        },
        Headers.EVENT_TYPE: {
            "type": "string",
            "description": "The CloudEvents type, as in the body.",
        },
        Headers.TRACEPARENT: {
            "type": "string",
            "description": "W3C trace context of the emitter.",
        },
    },
}


def asyncapi_document(version: str) -> dict[str, Any]:
    """AsyncAPI 3.0 for the session event stream; payloads refer to the exported JSON Schemas."""
    channels, operations, messages = _channels()
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Helmline session events",
            "version": version,
            "description": (
                "Every fact about every agent session, as CloudEvents 1.0 (structured JSON) "
                "on NATS JetStream, stream HELMLINE_EVENTS. Subscribe with a durable consumer "
                "and a subject filter; see docs/subscribers.md."
            ),
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "nats": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "The NATS server of your Helmline installation.",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "parameters": {
                "tenant": {"description": "Tenant id (lower-case letters, digits, - and _)."},
                "sessionId": {"description": "Session id within the tenant."},
            },
            "schemas": {"headers": _HEADERS},
            "messages": messages,
        },
    }
