"""The FastAPI application: routes, problem details, authentication and the web console."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Response
from fastapi.staticfiles import StaticFiles

from helmline.api import (
    _events,
    _key_routes,
    _mcp_routes,
    _plan_graph,
    _routes,
    _session_parts,
)
from helmline.api._auth import Authenticator
from helmline.api._fanout import FanOut
from helmline.api._limits import BodyLimit
from helmline.api._problems import install_problem_handlers, not_found
from helmline.api._reads import SessionLister
from helmline.api._settings import ApiSettings
from helmline.runtime import FoldedStates, ServiceHost

CONSOLE_BUILD = Path(__file__).resolve().parents[3] / "console" / "dist"
"""Where `npm run build` puts the console in a source checkout."""


def create_app(host: ServiceHost, settings: ApiSettings) -> FastAPI:
    """The HTTP API, answering from the event log the service host is connected to."""
    app = FastAPI(
        title="Helmline",
        summary="Control plane for tool-using AI agents: sessions, approvals, live events",
        version="0.1.0",
    )
    app.state.store = host.store
    app.state.js = host.js
    # States are read from the nearest one the state service stored, plus the events after.
    app.state.states = FoldedStates(host.js, host.store)
    app.state.latest_states = _session_parts.LatestStates(app.state.states)
    app.state.authenticator = Authenticator(settings, host.js)
    app.state.lister = SessionLister(host.store, settings.database_url)
    app.state.fan_out = FanOut(host.js)
    install_problem_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)

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

    app.include_router(_routes.router)
    app.include_router(_session_parts.router)
    app.include_router(_plan_graph.router)
    app.include_router(_events.router)
    app.include_router(_key_routes.router)
    app.include_router(_mcp_routes.router)
    console = settings.console_dir or CONSOLE_BUILD
    if (console / "index.html").is_file():
        app.mount("/", StaticFiles(directory=console, html=True), name="console")
    else:

        @app.get("/", include_in_schema=False)
        async def no_console() -> None:
            raise not_found(
                f"the web console is not built ({console} has no index.html): run `make install`"
            )

    return app
