"""How `up` launches a service, and how its readiness is probed."""

from __future__ import annotations

import http.client
import sys
from collections.abc import Mapping
from pathlib import Path

from helmline.cli._catalogue import ServiceName
from helmline.cli._processes import spawn_detached
from helmline.cli._record import ComponentRecord


def start_service(
    service: ServiceName,
    *,
    health_port: int,
    log: Path,
    env: Mapping[str, str],
    cwd: Path,
    address: str | None = None,
) -> ComponentRecord:
    """Launch a service; `address` is what people reach it at (the API's), else its health
    and metrics endpoint."""
    # The same interpreter as this command, so the service runs from the same environment
    # whatever PATH holds.
    argv = [sys.executable, "-m", "helmline.cli", "serve", service.value]
    process = spawn_detached(
        argv, log=log, env={**env, "HELMLINE_HEALTH_PORT": str(health_port)}, cwd=cwd
    )
    return ComponentRecord(
        name=service.value,
        kind="service",
        address=address or f"http://127.0.0.1:{health_port}",
        process=process,
        health_port=health_port,
        log=log,
    )


def service_is_ready(health_port: int, *, timeout: float = 1.0) -> bool:
    """GET /readyz on the service's health port answers 200."""
    connection = http.client.HTTPConnection("127.0.0.1", health_port, timeout=timeout)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
