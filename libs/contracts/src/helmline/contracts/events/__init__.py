"""Every event type, one class each, in the module of its aggregate.

Each class declares everything about its event (type string, version and upcasters, the
services that publish it, an example); the catalogue below and everything built from it (the
envelopes, the JSON Schemas, the AsyncAPI document, NATS permissions, the tests' examples)
are derived from the classes. To add an event type, declare its class in its aggregate's
module; to add an aggregate, import its module below and add it to `_AGGREGATES`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from helmline.contracts._payload import Payload
from helmline.contracts.events import (
    approvals,
    checkpoints,
    keys,
    mcp,
    plans,
    rollbacks,
    sandbox,
    sessions,
    steps,
    streams,
    tools,
    workspaces,
)
from helmline.contracts.events.approvals import *  # noqa: F403
from helmline.contracts.events.checkpoints import *  # noqa: F403
from helmline.contracts.events.keys import *  # noqa: F403
from helmline.contracts.events.mcp import *  # noqa: F403
from helmline.contracts.events.plans import *  # noqa: F403
from helmline.contracts.events.rollbacks import *  # noqa: F403
from helmline.contracts.events.sandbox import *  # noqa: F403
from helmline.contracts.events.sessions import *  # noqa: F403
from helmline.contracts.events.steps import *  # noqa: F403
from helmline.contracts.events.streams import *  # noqa: F403
from helmline.contracts.events.tools import *  # noqa: F403
from helmline.contracts.events.workspaces import *  # noqa: F403

_AGGREGATES: tuple[ModuleType, ...] = (
    sessions,
    plans,
    approvals,
    steps,
    tools,
    mcp,
    sandbox,
    workspaces,
    checkpoints,
    rollbacks,
    streams,
    keys,
)
"""The aggregates' modules, in catalogue order: the order of the published documents."""


def _defined_in(module: ModuleType) -> list[str]:
    # A module's public names are the classes and functions it defines and the type aliases
    # it annotates (`X: TypeAlias = ...`), not what it imports.
    annotated = vars(module).get("__annotations__", {})
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (getattr(value, "__module__", None) == module.__name__ or name in annotated)
    ]


PAYLOAD_CLASSES: tuple[type[Payload], ...] = tuple(
    value
    for module in _AGGREGATES
    for value in vars(module).values()
    if isinstance(value, type)
    and issubclass(value, Payload)
    and value.__module__ == module.__name__
)
"""Every payload of the catalogue: by aggregate, then in declaration order."""

# mypy takes the names from the star imports above; at run time `__all__` keeps a star import
# of this package to the names the aggregates' modules define (not what they import).
if not TYPE_CHECKING:
    __all__ = ["PAYLOAD_CLASSES", *(name for module in _AGGREGATES for name in _defined_in(module))]
