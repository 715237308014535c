"""Schema versions and upcasters: old events stay readable after a payload changes.

Only the newest payload class exists in code. An upcaster turns the raw `data` of version N
of a type into version N + 1; decoding applies them in order up to the current version. Each
payload class declares its own (`upcast_v1_v2`, ...); the registry collects them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from helmline.contracts._errors import UnknownEventType, UnknownSchemaVersion
from helmline.contracts._payload import Payload, Upcaster
from helmline.contracts.events import PAYLOAD_CLASSES


class UpcasterRegistry:
    """Upcasters by event type and the version they start from."""

    def __init__(self, current_versions: dict[str, int]) -> None:
        self._current = dict(current_versions)
        self._steps: dict[tuple[str, int], Upcaster] = {}

    def current_version(self, event_type: str) -> int | None:
        """The version this build writes for a type, or None for an unknown type."""
        return self._current.get(event_type)

    def register(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorate a function that upcasts `event_type` from `from_version` to the next."""
        if event_type not in self._current:
            raise UnknownEventType(f"cannot register an upcaster for unknown type {event_type!r}")

        def add(upcaster: Upcaster) -> Upcaster:
            self._steps[(event_type, from_version)] = upcaster
            return upcaster

        return add

    def upcast(self, document: dict[str, Any]) -> dict[str, Any]:
        """Bring a raw CloudEvents document to the current schema version of its type."""
        event_type = document.get("type")
        if not isinstance(event_type, str):
            raise UnknownEventType("the event has no string `type` attribute")
        current = self._current.get(event_type)
        if current is None:
            raise UnknownEventType(f"unknown event type {event_type!r}")
        version = document.get("schemaversion", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise UnknownSchemaVersion(f"{event_type}: invalid schema version {version!r}")
        if version > current:
            raise UnknownSchemaVersion(
                f"{event_type} schema version {version} is newer than this build ({current})"
            )
        if version == current:
            return document
        data = document.get("data")
        if not isinstance(data, dict):
            raise UnknownSchemaVersion(f"{event_type}: `data` must be an object to upcast")
        while version < current:
            step = self._steps.get((event_type, version))
            if step is None:
                raise UnknownSchemaVersion(
                    f"{event_type} schema version {version} has no upcaster to {version + 1}"
                )
            data = step(dict(data))
            version += 1
        return {**document, "data": data, "schemaversion": version}

    @classmethod
    def of(cls, payloads: Iterable[type[Payload]]) -> UpcasterRegistry:
        """The registry of these payload classes' versions and the upcasters they declare."""
        payloads = tuple(payloads)
        registry = cls({payload.TYPE: payload.SCHEMA_VERSION for payload in payloads})
        for payload in payloads:
            for from_version, upcaster in payload.upcasters().items():
                registry.register(payload.TYPE, from_version)(upcaster)
        return registry


UPCASTERS = UpcasterRegistry.of(PAYLOAD_CLASSES)
"""The registry decoding uses by default: every event type of the catalogue."""
