"""The API in this process, in front of every other service as its own process.

Tests talk to it over real HTTP; bearer tokens are checked against a real JWKS served over
HTTP by a key of the test's own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from nats.js import JetStreamContext

from helmline.api import Role, new_api_key, store_api_key
from helmline.api.__main__ import setup_api
from helmline.api._settings import ApiSettings
from helmline.contracts import Actor
from helmline.runtime import ServiceHost
from helmline.runtime.testing import ServiceProcesses, free_port

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
POLICY = """
description: The default policy, but files are not deleted by command.
approval: {roles: [approver, admin], quorum: 1, expires_in: 10m}
permission_requests: {roles: [approver, admin], expires_in: 10m, grant_at_most: 1d}
rules:
  - name: no-deleting-by-command
    tool: run_command
    arguments:
      command: {regex: '^rm\\b'}
    effect: deny
    reason: delete files with delete_file, which a rollback can undo
  - name: allow-low-and-medium-risk
    risk: [low, medium]
    effect: allow
  - name: approve-high-and-critical-risk
    risk: [high, critical]
    effect: require_approval
"""
"""What the approval service decides by: a grant with modified arguments the policy refuses
is then the approval service's to refuse (the API checks arguments against the tool's
schema only); a step reaching a network host no rule grants asks for it."""
ISSUER = "https://issuer.test"
AUDIENCE = "helmline-api"


@contextmanager
def stack(
    nats_url: str, database_url: str, folder: Path, **settings: str
) -> Iterator[ServiceProcesses]:
    """Every service but the API, each its own process, under POLICY, with `settings` in their
    environment (`HELMLINE_MCP_SERVERS`, say)."""
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    running = ServiceProcesses(nats_url, folder)
    try:
        with pytest.MonkeyPatch.context() as env:
            # The state service projects into PostgreSQL, which the API lists from.
            env.setenv("HELMLINE_DATABASE_URL", database_url)
            env.setenv("HELMLINE_POLICY", str(policy))
            for name, value in settings.items():
                env.setenv(name, value)
            for name in SERVICES:
                running.start(name)
        yield running
    finally:
        running.stop_all()


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    """Settings the services start with besides the stack's own: none; a module overrides
    this to give its planner a model, say."""
    return {}


@pytest.fixture(scope="module")
def services(
    nats_url: str,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    stack_env: dict[str, str],
) -> Iterator[ServiceProcesses]:
    folder = tmp_path_factory.mktemp("stack")
    with stack(nats_url, database_url, folder, **stack_env) as running:
        yield running


@dataclass(frozen=True)
class Issuer:
    """An OIDC provider's signing key, published as a JWKS over HTTP."""

    jwks_url: str
    key: rsa.RSAPrivateKey

    def token(self, *, key: rsa.RSAPrivateKey | None = None, **claims: Any) -> str:
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "ana", "exp": 4_000_000_000, **claims}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": "test-key"})


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**public, "kid": "test-key", "use": "sig", "alg": "RS256"}]})

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Issuer(f"http://127.0.0.1:{server.server_address[1]}/jwks.json", key)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
async def api_url(
    services: ServiceProcesses, nats_url: str, database_url: str, issuer: Issuer
) -> AsyncIterator[str]:
    """Base URL of a running API service."""
    settings = ApiSettings(
        nats_url=nats_url,
        api_port=free_port(),
        database_url=database_url,
        jwks_url=issuer.jwks_url,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
    )
    async with ServiceHost("api", settings) as host:
        await setup_api(settings)(host)
        serving = asyncio.create_task(host.run_until_stopped())
        yield f"http://127.0.0.1:{settings.api_port}"
        host.request_stop()
        await serving


KeyMaker = Callable[..., Awaitable[dict[str, str]]]


@pytest.fixture
def make_key(js: JetStreamContext) -> KeyMaker:
    """Headers carrying a new API key of a tenant with the given roles."""

    async def make(tenant: str, *roles: Role) -> dict[str, str]:
        key, record = new_api_key(tenant, roles, name=f"{tenant}-{'-'.join(roles)}")
        await store_api_key(js, record, by=Actor(id="test"))
        return {"Authorization": f"Bearer {key}"}

    return make


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        yield http
