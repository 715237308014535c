"""Confining processes, shared by the sandbox service (its commands) and the tool gateway (its
stdio MCP servers): which bubblewrap runs here, what every sandbox sees of the host, limits,
and egress to named hosts only."""

from helmline.confinement._bubblewrap import (
    NAMESPACES_ADVICE,
    Bubblewrap,
    BubblewrapUnavailable,
    find_bubblewrap,
    namespaces_refused,
)
from helmline.confinement._egress import (
    FORWARDER_SCRIPT,
    SETPRIV,
    WATCHING_CAPABILITIES,
    Destination,
    EgressError,
    EgressPlan,
    EgressProxy,
    Refused,
    Route,
    checked_destinations,
)
from helmline.confinement._sandbox_egress import RUN_FOLDER, Egress, install_folders, open_egress
from helmline.confinement._system import PRLIMIT, SYSTEM_BINDS, Rlimits, limited_argv

__all__ = [
    "FORWARDER_SCRIPT",
    "NAMESPACES_ADVICE",
    "PRLIMIT",
    "RUN_FOLDER",
    "SETPRIV",
    "SYSTEM_BINDS",
    "WATCHING_CAPABILITIES",
    "Bubblewrap",
    "BubblewrapUnavailable",
    "Destination",
    "Egress",
    "EgressError",
    "EgressPlan",
    "EgressProxy",
    "Refused",
    "Rlimits",
    "Route",
    "checked_destinations",
    "find_bubblewrap",
    "install_folders",
    "limited_argv",
    "namespaces_refused",
    "open_egress",
]
