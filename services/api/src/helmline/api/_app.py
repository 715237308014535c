"""The FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI, Response

from helmline.runtime import ServiceHost


def create_app(host: ServiceHost) -> FastAPI:
    """The HTTP API, answering from the event log the service host is connected to."""
    app = FastAPI(
        title="Helmline",
        summary="Control plane for tool-using AI agents",
        version="0.1.0",
    )

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The API process is alive."""
        return {"service": "api", "status": "alive"}

    @app.get("/readyz", tags=["health"])
    async def readyz(response: Response) -> dict[str, str]:
        """The API can serve requests: it is connected to the event log."""
        if not host.ready:
            response.status_code = 503
            return {"service": "api", "status": "not ready"}
        return {"service": "api", "status": "ready"}

    return app
