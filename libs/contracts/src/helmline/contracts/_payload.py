"""The base of every event payload, and what each event type declares on its class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Self

from helmline.contracts._services import SERVICES
from helmline.contracts._values import Contract

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a payload of one schema version into the next version."""


class Payload(Contract):
    """Base of every event payload: the CloudEvents `data` of one event type.

    An event type is one subclass in the module of its aggregate (`helmline.contracts.events.*`),
    which declares everything about it; the catalogue, schemas, AsyncAPI document and NATS
    permissions are derived from these classes:

        class NoteTaken(Payload, type="note.taken", published_by=(PLANNER,)):
            text: str

            @classmethod
            def example(cls) -> Self:
                return cls(text="the user prefers metric units")

    A breaking change bumps `version=` and adds, for each older version N, a static method
    `upcast_vN_vM` (M = N + 1) that turns the raw `data` of version N into version M.
    """

    TYPE: ClassVar[str]
    """The permanent CloudEvents type string; it never changes once published."""
    SCHEMA_VERSION: ClassVar[int] = 1
    """Bumped on a breaking change, with an upcaster from the previous version."""
    PUBLISHED_BY: ClassVar[tuple[str, ...]]
    """The services that append the event: each may publish it, and no other."""

    def __init_subclass__(
        cls,
        *,
        type: str,
        published_by: tuple[str, ...],
        version: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.TYPE = type
        cls.SCHEMA_VERSION = version
        cls.PUBLISHED_BY = published_by
        _check_declaration(cls)

    @classmethod
    def example(cls) -> Self:
        """An example of the event: documentation for subscribers, checked by the tests."""
        raise NotImplementedError(f"{cls.__name__} declares no example")

    @classmethod
    def upcasters(cls) -> dict[int, Upcaster]:
        """The upcasters from each older schema version to the next, by the version they
        start from."""
        return {
            version: getattr(cls, _upcaster_name(version))
            for version in range(1, cls.SCHEMA_VERSION)
        }


def _upcaster_name(from_version: int) -> str:
    return f"upcast_v{from_version}_v{from_version + 1}"


def _check_declaration(cls: type[Payload]) -> None:
    # At class creation, so that a declaration missing a part fails on import, naming it.
    name = cls.__name__
    if not cls.PUBLISHED_BY or not set(cls.PUBLISHED_BY) <= set(SERVICES):
        raise TypeError(f"{name}: published_by must name some of {SERVICES}")
    if cls.SCHEMA_VERSION < 1:
        raise TypeError(f"{name}: version must be 1 or more")
    if "example" not in vars(cls):
        raise TypeError(f"{name} declares no example (a classmethod `example`)")
    declared = {attribute for attribute in vars(cls) if attribute.startswith("upcast_v")}
    expected = {_upcaster_name(version) for version in range(1, cls.SCHEMA_VERSION)}
    if declared != expected:
        raise TypeError(
            f"{name} is version {cls.SCHEMA_VERSION}: it needs exactly the upcasters "
            f"{sorted(expected)}, and declares {sorted(declared)}"
        )
