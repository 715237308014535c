"""The CloudEvents 1.0 envelope, and how events are encoded, decoded and derived."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    computed_field,
    field_serializer,
    model_validator,
)

from helmline.contracts._catalogue import EventData, Payload
from helmline.contracts._errors import UndecodableEvent
from helmline.contracts._values import Contract, SessionId, TenantId, Traceparent
from helmline.contracts._versions import UPCASTERS, UpcasterRegistry


class Event(Contract):
    """One fact in a session's log: a CloudEvents 1.0 envelope around a typed payload.

    On the wire this is CloudEvents structured JSON: the standard attributes, the
    extension attributes `tenant`, `sessionid`, `causationid`, `correlationid`,
    `schemaversion` and `traceparent`, and the payload under `data`.
    """

    specversion: Literal["1.0"] = "1.0"
    """CloudEvents specification version."""
    id: uuid.UUID
    """Unique event id; also the JetStream message id, so a re-published event is stored once."""
    source: str = Field(min_length=1, max_length=256)
    """What emitted the event, e.g. `helmline/planner` or `helmline/api`."""
    time: AwareDatetime
    """When the event was emitted."""
    subject: str | None = None
    """CloudEvents subject: the session id."""
    datacontenttype: Literal["application/json"] = "application/json"
    """Media type of `data`."""
    tenant: TenantId
    """The tenant that owns the session."""
    session_id: SessionId = Field(alias="sessionid")
    """The session the event belongs to."""
    causation_id: uuid.UUID | None = Field(default=None, alias="causationid")
    """The event that caused this one; empty for intents from people."""
    correlation_id: uuid.UUID = Field(alias="correlationid")
    """The intent that started this chain of events."""
    traceparent: Traceparent | None = None
    """W3C trace context of the span that emitted the event."""
    data: EventData
    """The payload, whose model is chosen by `type`."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def type(self) -> str:
        """CloudEvents type: the permanent name of the event type, e.g. `tool.call.completed`."""
        return self.data.type

    @computed_field(alias="schemaversion")  # type: ignore[prop-decorator]
    @property
    def schema_version(self) -> int:
        """Version of the payload's schema; older versions are upcast when read."""
        return type(self.data).SCHEMA_VERSION

    @model_validator(mode="before")
    @classmethod
    def _move_type_into_data(cls, value: Any) -> Any:
        # On the wire the type is an envelope attribute; in memory it discriminates `data`.
        if not isinstance(value, dict) or "type" not in value:
            return value
        fields = dict(value)
        event_type = fields.pop("type")
        version = fields.pop("schemaversion", None)
        payload = fields.get("data")
        if isinstance(payload, dict):
            fields["data"] = {**payload, "type": event_type}
        current = UPCASTERS.current_version(event_type)
        if version is not None and current is not None and version != current:
            raise ValueError(
                f"{event_type} schema version {version} must be upcast to {current} "
                "before validation (decode it with decode_event)"
            )
        return fields

    @field_serializer("data", mode="wrap")
    def _drop_type_from_data(self, payload: Payload, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(payload)
        dumped.pop("type", None)
        return dumped

    def derive(
        self,
        data: Payload,
        *,
        source: str,
        key: str = "",
        traceparent: str | None = None,
        at: datetime | None = None,
    ) -> Event:
        """An event caused by this one.

        Its id is derived from this event's id, the source, the new type and `key`, so a
        handler that runs again after a redelivery emits the same id and JetStream stores
        the event once. Give a distinct `key` when one cause yields several events of one type.
        """
        return Event(
            id=uuid.uuid5(self.id, f"{source}/{data.type}/{key}"),
            source=source,
            time=at or datetime.now(UTC),
            subject=self.session_id,
            tenant=self.tenant,
            session_id=self.session_id,
            causation_id=self.id,
            correlation_id=self.correlation_id,
            traceparent=traceparent or self.traceparent,
            data=data,  # type: ignore[arg-type]
        )


def new_event(
    data: Payload,
    *,
    tenant: str,
    session_id: str,
    source: str,
    traceparent: str | None = None,
    event_id: uuid.UUID | None = None,
    at: datetime | None = None,
) -> Event:
    """An event that starts a new chain: an intent from a person or another system."""
    event_id = event_id or uuid.uuid4()
    return Event(
        id=event_id,
        source=source,
        time=at or datetime.now(UTC),
        subject=session_id,
        tenant=tenant,
        session_id=session_id,
        causation_id=None,
        correlation_id=event_id,
        traceparent=traceparent,
        data=data,  # type: ignore[arg-type]
    )


def encode_event(event: Event) -> bytes:
    """CloudEvents structured JSON for an event."""
    return event.model_dump_json().encode()


def decode_event(raw: bytes | str, upcasters: UpcasterRegistry = UPCASTERS) -> Event:
    """Parse CloudEvents JSON into an event, upcasting older schema versions.

    Raises `UndecodableEvent` (or a subclass) naming what is wrong; never anything else.
    """
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise UndecodableEvent(f"not valid JSON: {error}") from error
    if not isinstance(document, dict):
        raise UndecodableEvent("an event must be a JSON object")
    document = upcasters.upcast(document)
    try:
        return Event.model_validate(document)
    except ValidationError as error:
        raise UndecodableEvent(_describe(error)) from error


def _describe(error: ValidationError) -> str:
    problems = []
    for detail in error.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in detail["loc"]) or "event"
        problems.append(f"{where}: {detail['msg']}")
    return "invalid event: " + "; ".join(problems)
