"""How a service's readiness is probed."""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Readiness:
    """What a service's `/readyz` answered."""

    ready: bool
    about: Mapping[str, str] = field(default_factory=dict)
    """What the service says of how it runs (the sandbox: which bubblewrap)."""


def service_readiness(health_port: int, *, timeout: float = 1.0) -> Readiness:
    """GET /readyz on the service's health port: ready when it answers 200."""
    connection = http.client.HTTPConnection("127.0.0.1", health_port, timeout=timeout)
    try:
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException):
        return Readiness(ready=False)
    finally:
        connection.close()
    try:
        about = json.loads(body).get("about", {})
    except (ValueError, AttributeError):
        about = {}
    return Readiness(ready=response.status == 200, about=about)
