"""The services, by the names `helmline serve <name>` and their NATS users spell."""

from __future__ import annotations

PLANNER = "planner"
APPROVAL = "approval"
TOOL_GATEWAY = "tool-gateway"
SANDBOX = "sandbox"
STATE = "state"
API = "api"
"""Appends the intents of people and other systems (the CLI appends them as NATS admin)."""
SERVICES: tuple[str, ...] = (PLANNER, APPROVAL, TOOL_GATEWAY, SANDBOX, STATE, API)
"""Every service, named as `helmline serve <name>` and NATS user names spell it."""
