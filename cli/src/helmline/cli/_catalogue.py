"""The services of a stack, as people name them and as Python imports them."""

from __future__ import annotations

from enum import StrEnum


class ServiceName(StrEnum):
    """A service as people name it (`helmline serve tool-gateway`)."""

    PLANNER = "planner"
    TOOL_GATEWAY = "tool-gateway"
    STATE = "state"
    APPROVAL = "approval"
    SANDBOX = "sandbox"
    API = "api"

    @property
    def module(self) -> str:
        """The service's package under `helmline.`; Python names cannot hold a dash."""
        return f"helmline.{self.value.replace('-', '_')}"
