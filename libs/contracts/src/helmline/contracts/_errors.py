"""Errors raised by the contracts package."""

from __future__ import annotations


class ContractError(Exception):
    """Root of every error raised by `helmline.contracts`."""


class UndecodableEvent(ContractError):
    """Bytes that are not a valid event of this catalogue; the message says why."""


class UnknownEventType(UndecodableEvent):
    """An event type this build does not know."""


class UnknownSchemaVersion(UndecodableEvent):
    """A schema version that no upcaster can bring to the current one."""
