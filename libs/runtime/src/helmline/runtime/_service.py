"""The life of a service process: connect, consume, report health, shut down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Literal

import nats
import uvicorn
import uvloop
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from helmline.contracts import ConsumerSpec, source_of
from helmline.runtime._consumer import EventConsumer, Handler
from helmline.runtime._folded_states import FoldedStates
from helmline.runtime._history import History
from helmline.runtime._logging import configure_logging
from helmline.runtime._metrics import ServiceMetrics
from helmline.runtime._nats_client import connect_nats
from helmline.runtime._provision import ensure_topology
from helmline.runtime._secrets import SecretStore, load_secrets_key
from helmline.runtime._settings import RuntimeSettings, nats_servers
from helmline.runtime._store import EventStore
from helmline.runtime._sweeps import Sweep, sweep_every
from helmline.runtime._tracing import TracingSettings, service_tracer

logger = logging.getLogger(__name__)


class ServiceHost:
    """Runs one service: an async context manager around its connection and consumers.

    ```
    async with ServiceHost("planner", settings) as host:
        await host.consume(PLANNER_CONSUMER, handle)
        await host.run_until_stopped()
    ```
    SIGTERM or SIGINT ends `run_until_stopped`; leaving the block stops fetching, lets
    in-flight messages finish within the grace period and drains the connection.
    """

    def __init__(self, name: str, settings: RuntimeSettings) -> None:
        self.name = name
        self.settings = settings
        self._stop = asyncio.Event()
        self._nc: NATS | None = None
        self._consumers: list[EventConsumer] = []
        self._health: HttpServer | None = None
        self._cleanups: list[Callable[[], Awaitable[None]]] = []
        self._closed = False
        self._serving = False
        self.metrics = ServiceMetrics(name)
        """This service's Prometheus metrics, served on `/metrics`."""
        self.about: dict[str, str] = {}
        """What an operator should know of how this process runs (which sandbox confines
        commands, say), answered by `/readyz` and shown by `helmline status`."""
        self._tracer, self._tracer_provider = service_tracer(name, TracingSettings())
        self._secrets: SecretStore | None = None

    @property
    def nc(self) -> NATS:
        """The NATS connection."""
        assert self._nc is not None, "the service host is not started"
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        """JetStream on that connection."""
        return self.nc.jetstream()

    @property
    def store(self) -> EventStore:
        """The event store; what it appends shows in this service's metrics."""
        return EventStore(self.js, on_append=self.metrics.appended)

    @property
    def states(self) -> FoldedStates:
        """Sessions' folded states stored beside the log, which spare replaying a long
        session's whole log."""
        return FoldedStates(self.js, self.store)

    @property
    def secrets(self) -> SecretStore:
        """The tenants' secrets, which this process redacts from what it records."""
        assert self._secrets is not None, "the service host is not started"
        return self._secrets

    @property
    def ready(self) -> bool:
        """Set up and serving, connected, and every consumer receiving."""
        return (
            self._serving
            and self._nc is not None
            and self._nc.is_connected
            and all(consumer.running for consumer in self._consumers)
            and not self._stop.is_set()
        )

    async def _reconnected(self) -> None:
        for consumer in self._consumers:
            consumer.reconnected()

    async def refresh_lag(self) -> None:
        """Read every consumer's lag from JetStream into the metrics (before a scrape)."""
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await asyncio.gather(*(consumer.refresh_lag() for consumer in self._consumers))

    async def __aenter__(self) -> ServiceHost:
        self._nc = await connect_nats(
            nats_servers(self.settings.nats_url),
            name=f"helmline-{self.name}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            reconnected_cb=self._reconnected,
        )
        try:
            await ensure_topology(
                self.js,
                events_max_age_s=self.settings.events_max_age_s,
                events_max_bytes=self.settings.events_max_bytes,
                replicas=self.settings.stream_replicas,
            )
            await self._follow_secrets()
            self._health = HttpServer(
                _health_app(self), self.settings.health_host, self.settings.health_port
            )
            await self._health.start()
        except BaseException:
            # Not started, so no `async with` exit will run: let go of the connection here.
            await self.shutdown()
            raise
        logger.info("%s started (health on port %d)", self.name, self._health.port)
        return self

    async def _follow_secrets(self) -> None:
        """Redact every secret's value from what this service records, from its first event
        on: the values set before it started are loaded before it consumes anything."""
        secret = self.settings.secrets_key
        key = load_secrets_key(
            secret.get_secret_value() if secret is not None else None,
            self.settings.secrets_key_file,
        )
        folder = self.settings.secrets_dir
        self._secrets = await SecretStore.open(self.js, key, folder)
        if key is None and await self._secrets.records():
            logger.warning(
                "secrets are set but this process has no secrets key (HELMLINE_SECRETS_KEY "
                "or HELMLINE_SECRETS_KEY_FILE): it cannot redact their values nor resolve "
                "references to them"
            )
        if key is None and folder is None:
            return
        loaded = asyncio.Event()
        secrets = self._secrets

        async def follow() -> None:
            try:
                await secrets.follow(loaded)
            except Exception:
                # Going on would leave secrets set from now on unredacted: stop, and let the
                # supervisor (or Kubernetes) start the service again.
                logger.exception("%s stopped following the secrets; stopping", self.name)
                self.request_stop()

        self.run_in_background(follow())
        await asyncio.wait_for(loaded.wait(), timeout=30.0)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.shutdown()

    async def consume(self, spec: ConsumerSpec, handler: Handler) -> None:
        """Start feeding a durable consumer's events to `handler`: those that are not
        history, when the consumer decides (see `History`)."""
        history = History(self.store, spec, source_of(self.name)) if spec.decides else None
        consumer = EventConsumer(
            self.nc,
            self.js,
            spec,
            handler,
            metrics=self.metrics,
            tracer=self._tracer,
            admit=history.admit if history is not None else None,
        )
        await consumer.start()
        self._consumers.append(consumer)

    async def serve_http(self, app: ASGIApp, interface: str, port: int) -> HttpServer:
        """Serve another ASGI app (the public API) for as long as the service runs."""
        server = HttpServer(app, interface, port)
        await server.start()
        self.on_shutdown(server.stop)
        return server

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (a watcher, a periodic check) while the service runs; it is cancelled
        when the service stops."""
        task = asyncio.create_task(work)

        async def cancel() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        self.on_shutdown(cancel)

    def sweep_regularly(self, what: str, sweep: Sweep) -> None:
        """Run `sweep` every `sweep_interval_s` while the service runs, if the events stream
        has retention limits: without them no session's log ever goes, so nothing kept for
        it goes stale."""
        limits = (self.settings.events_max_age_s, self.settings.events_max_bytes)
        if limits != (None, None):
            self.run_in_background(sweep_every(self.settings.sweep_interval_s, what, sweep))

    def on_shutdown(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Run `cleanup` when the service stops, once its consumers have finished their
        in-flight work (last added first), so handlers never meet a closed resource."""
        self._cleanups.append(cleanup)

    def request_stop(self) -> None:
        """Ask the service to stop, as SIGTERM does."""
        self._stop.set()

    async def run_until_stopped(self) -> None:
        """Serve until SIGTERM, SIGINT or `request_stop`; ready from now on."""
        with _signals_set(self._stop):
            self._serving = True
            await self._stop.wait()
        self._serving = False
        logger.info("%s stopping", self.name)

    async def shutdown(self) -> None:
        """Stop consumers, finish in-flight work within the grace period, drain. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for consumer in self._consumers:
            await consumer.stop(self.settings.shutdown_grace_s)
        for cleanup in reversed(self._cleanups):
            await cleanup()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error):
                await self._nc.drain()
        if self._health is not None:
            await self._health.stop()
        if self._tracer_provider is not None:
            # Spans still batched are sent now; the exporter gives up after its timeout.
            await asyncio.to_thread(self._tracer_provider.shutdown)
        logger.info("%s stopped", self.name)


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT)
    for signum in handled:
        loop.add_signal_handler(signum, stop.set)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


class _QuietServer(uvicorn.Server):
    # The service host owns SIGTERM and SIGINT; uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """An ASGI app served by uvicorn inside the service's event loop."""

    def __init__(self, app: ASGIApp, interface: str, port: int) -> None:
        config = uvicorn.Config(
            app, host=interface, port=port, log_level="warning", lifespan="off", access_log=False
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The port listened on (useful when 0 asked for a free one)."""
        servers = self._server.servers
        if not servers or not servers[0].sockets:
            return 0
        return int(servers[0].sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen, and return once connections are accepted."""
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task  # Raises why it could not start (port taken...).
                raise RuntimeError("HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop listening and close connections."""
        self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None


def _health_app(host: ServiceHost) -> Starlette:
    """`/healthz`: the process is alive; `/readyz`: it can do its work; `/metrics`: Prometheus."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"service": host.name, "status": "alive"})

    async def readyz(request: Request) -> JSONResponse:
        ready = host.ready
        return JSONResponse(
            {
                "service": host.name,
                "status": "ready" if ready else "not ready",
                "about": host.about,
            },
            status_code=200 if ready else 503,
        )

    async def metrics(request: Request) -> Response:
        await host.refresh_lag()
        return Response(generate_latest(host.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
    )


Setup = Callable[[ServiceHost], Awaitable[None]]
"""Wires a service's consumers and tasks onto a started host."""


EventLoop = Literal["uvloop", "asyncio"]
"""Which event loop a service runs on."""


def run_service(
    name: str,
    settings: RuntimeSettings,
    setup: Setup | None = None,
    *,
    event_loop: EventLoop = "uvloop",
) -> None:
    """The body of a service's `main()`: run it until SIGTERM, then shut down gracefully.

    Services run on uvloop: their time goes to waking for one message, handling it and
    writing the next, and uvloop's loop does its part of that in C (side by side here: about
    a tenth more steps per second than asyncio's loop). A service that mostly starts
    processes may choose asyncio's, whose spawning is quicker (see the sandbox).
    """
    configure_logging(name, settings.log_level, settings.log_format)

    async def serve() -> None:
        async with ServiceHost(name, settings) as host:
            if setup is not None:
                await setup(host)
            _freeze_startup_objects()
            await host.run_until_stopped()

    if event_loop == "uvloop":
        uvloop.run(serve())
    else:
        asyncio.run(serve())


def _freeze_startup_objects() -> None:
    """Keep what a process made while starting out of the garbage collector's scans.

    Modules, schemas and compiled validators live as long as the process, yet every full
    collection walked all of them: about 60 ms for a service here, during which every
    message in flight waited.
    """
    gc.collect()
    gc.freeze()
