"""The CloudEvents 1.0 envelope, and how events are encoded, decoded and derived.

Every event type has its own envelope class, generated from its payload, whose `type` and
`schemaversion` are literals. Their union is discriminated by `type`, so decoding the wire
form is a single validation pass in pydantic-core; only events written with an older schema
version take the slower path through the upcasters.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union

from pydantic import AwareDatetime, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import from_json

from helmline.contracts._errors import UndecodableEvent
from helmline.contracts._payload import Payload
from helmline.contracts._values import Contract, SessionId, TenantId, Traceparent
from helmline.contracts._versions import UPCASTERS, UpcasterRegistry
from helmline.contracts.events import PAYLOAD_CLASSES, SessionStarted


class Event(Contract):
    """One fact in a session's log: a CloudEvents 1.0 envelope around a typed payload.

    On the wire this is CloudEvents structured JSON: the standard attributes, the
    extension attributes `tenant`, `sessionid`, `causationid`, `correlationid`,
    `schemaversion` and `traceparent`, and the payload under `data`. Build events with
    `new_event` or `Event.derive`; decode them with `decode_event`.
    """

    specversion: Literal["1.0"] = "1.0"
    """CloudEvents specification version."""
    id: uuid.UUID
    """Unique event id; also the JetStream message id, so a re-published event is stored once."""
    source: str = Field(min_length=1, max_length=256)
    """What emitted the event, e.g. `helmline/planner` or `helmline/api`."""
    type: str
    """CloudEvents type: the permanent name of the event type, e.g. `tool.call.completed`."""
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
    """The event that caused this one; empty for intents from people and other systems."""
    correlation_id: uuid.UUID = Field(alias="correlationid")
    """The intent that started this chain of events."""
    schema_version: int = Field(alias="schemaversion")
    """Version of the payload's schema; older versions are upcast when read."""
    traceparent: Traceparent | None = None
    """W3C trace context of the span that emitted the event."""
    data: Payload
    """The payload, whose model is chosen by `type`."""

    def derive(
        self,
        data: Payload,
        *,
        source: str,
        key: str = "",
        identity: str | None = None,
        traceparent: str | None = None,
        at: datetime | None = None,
    ) -> Event:
        """An event caused by this one.

        Its id is derived from this event's id, the source, the new type and `key`, so a
        handler that runs again after a redelivery emits the same id and JetStream stores
        the event once. Give a distinct `key` when one cause yields several events of one type.

        Give `identity` instead when the fact itself, whatever caused it, must be stored once
        (say, "step b, attempt 1, was scheduled"): the id then derives from the session and
        that identity, so two replicas deciding it from different causes write one event.
        """
        if identity is not None:
            event_id = uuid.uuid5(_IDENTITIES, f"{self.tenant}/{self.session_id}/{identity}")
        else:
            event_id = uuid.uuid5(self.id, f"{source}/{data.TYPE}/{key}")
        return _envelope(
            data,
            id=event_id,
            source=source,
            time=at or datetime.now(UTC),
            subject=self.session_id,
            tenant=self.tenant,
            session_id=self.session_id,
            causation_id=self.id,
            correlation_id=self.correlation_id,
            traceparent=traceparent or self.traceparent,
        )


_IDENTITIES = uuid.UUID("5d1b0f3e-6a4c-4c53-9d55-0b3c2f8e7a11")
"""Namespace of ids derived from a fact's identity rather than from its cause."""


class _GeneratedEvent(Event):
    """Base of the envelope classes made below, one per payload class."""

    # They are made by create_model and have no source of their own: pydantic would search
    # the interpreter's frames and modules for it, class by class, which added about 0.3 s
    # to the start of every process. Their fields are documented on `Event`.
    model_config = ConfigDict(use_attribute_docstrings=False)


def _event_class(payload_class: type[Payload]) -> type[Event]:
    type_literal: Any = Literal[payload_class.TYPE]
    version_literal: Any = Literal[payload_class.SCHEMA_VERSION]
    return create_model(
        payload_class.__name__ + "Event",
        __base__=_GeneratedEvent,
        __doc__=payload_class.__doc__,
        type=(type_literal, payload_class.TYPE),
        schema_version=(
            version_literal,
            Field(payload_class.SCHEMA_VERSION, alias="schemaversion"),
        ),
        data=(payload_class, ...),
    )


EVENT_CLASSES: dict[type[Payload], type[Event]] = {
    payload_class: _event_class(payload_class) for payload_class in PAYLOAD_CLASSES
}
"""The envelope class of each payload class."""

_any_event_type: Any = Annotated[
    Union[tuple(EVENT_CLASSES.values())],  # noqa: UP007 - built from a tuple at run time
    Field(discriminator="type"),
]
_ANY_EVENT: TypeAdapter[Event] = TypeAdapter(_any_event_type)


def _envelope(data: Payload, **attributes: Any) -> Event:
    return EVENT_CLASSES[type(data)](data=data, **attributes)


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
    """An event that starts a new chain: an intent from a person or another system.

    A session begins a trace of its own: a `session.started` given no `traceparent` gets a
    new W3C trace context, which every event of the session then continues.
    """
    event_id = event_id or uuid.uuid4()
    if traceparent is None and isinstance(data, SessionStarted):
        traceparent = new_trace()
    return _envelope(
        data,
        id=event_id,
        source=source,
        time=at or datetime.now(UTC),
        subject=session_id,
        tenant=tenant,
        session_id=session_id,
        causation_id=None,
        correlation_id=event_id,
        traceparent=traceparent,
    )


def new_trace() -> str:
    """A W3C traceparent that begins a new, sampled trace."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def encode_event(event: Event) -> bytes:
    """CloudEvents structured JSON for an event."""
    return event.__pydantic_serializer__.to_json(event, by_alias=True)


def decode_event(raw: bytes | str, upcasters: UpcasterRegistry = UPCASTERS) -> Event:
    """Parse CloudEvents JSON into an event, upcasting older schema versions.

    Raises `UndecodableEvent` (or a subclass) naming what is wrong; never anything else.
    """
    try:
        return _ANY_EVENT.validate_json(raw)
    except ValidationError:
        pass  # Not current: maybe an older version to upcast, or garbage to explain.
    try:
        document = from_json(raw)
    except ValueError as error:
        raise UndecodableEvent(f"not valid JSON: {error}") from error
    if not isinstance(document, dict):
        raise UndecodableEvent("an event must be a JSON object")
    document = upcasters.upcast(document)
    try:
        return _ANY_EVENT.validate_python(document)
    except ValidationError as error:
        raise UndecodableEvent(_describe(error)) from error


def _describe(error: ValidationError) -> str:
    problems = []
    for detail in error.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in detail["loc"]) or "event"
        problems.append(f"{where}: {detail['msg']}")
    return "invalid event: " + "; ".join(problems)
