"""Instances of MCP servers and the caps on their calls (a server's `isolation` and `pool`).

A shared server has one instance, the connection the federation keeps (`McpServer`). A
server isolated per tenant or per session gets an instance of its own (a process over stdio,
a connection, hence an MCP session, over HTTP) for each tenant or session on its first call;
the federation's connection then only lists its tools, checks its health and pins its
definitions, and no call goes to it. A session's instance stops when the gateway hears the
session end; any tenant's or session's instance stops after the server's idle time without
a call. Each start and stop is recorded on the tools stream (`mcp.instance.*`): a gateway
that starts an instance for a tenant or session whose newest record is another gateway's
start names that instance in `replaces`, since none of its state came along.

Each server's calls pass through its pool: at most `calls_per_instance` in flight on an
instance, `max_calls` on all, `max_instances` instances. A call beyond waits in a queue of
`queue` places for at most `queue_timeout_s`, and fails as `rate_limited` with when to try
again when the queue is full or its wait is over: it never waits longer.

Instances belong to one gateway process: replicas each start their own, and a session whose
calls reach two replicas has an instance on each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from helmline.contracts import (
    TOOLS_SESSION,
    TOOLS_STREAM,
    TOOLS_TENANT,
    InstanceStopReason,
    McpInstance,
    McpInstanceStarted,
    McpInstanceStopped,
    Payload,
    ToolError,
    decode_event,
    mcp_instance_subject,
    new_event,
)
from helmline.runtime import METRICS_NAMESPACE, EventStore
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._mcp import McpServer

logger = logging.getLogger(__name__)

START_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)


class Scope(NamedTuple):
    """Whom an instance serves: a tenant, a tenant's session, or (both None) everyone."""

    tenant: str | None
    session_id: str | None


SHARED = Scope(None, None)


class PoolFull(Exception):
    """A call found its server's pool full and was not sent: `error` says why (kind
    `rate_limited`), `retry_in_s` when a place may be free."""

    def __init__(self, error: ToolError, retry_in_s: float) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_in_s = retry_in_s


class PoolMetrics:
    """The pools' figures, by server, on the service's `/metrics`."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        registry = registry or CollectorRegistry()
        self.instances = Gauge(
            "mcp_instances",
            "MCP server instances running.",
            ("server",),
            namespace=METRICS_NAMESPACE,
            registry=registry,
        )
        self.in_flight = Gauge(
            "mcp_calls_in_flight",
            "Calls sent to an MCP server's instances and not yet answered.",
            ("server",),
            namespace=METRICS_NAMESPACE,
            registry=registry,
        )
        self.queued = Gauge(
            "mcp_calls_queued",
            "Calls waiting for a place in an MCP server's pool.",
            ("server",),
            namespace=METRICS_NAMESPACE,
            registry=registry,
        )
        self.refused = Counter(
            "mcp_calls_refused",
            "Calls an MCP server's full pool refused (rate limited), by why: its queue was "
            "full, or their wait in it was over.",
            ("server", "why"),
            namespace=METRICS_NAMESPACE,
            registry=registry,
        )
        self.waited = Histogram(
            "mcp_queue_wait_seconds",
            "Time calls waited for a place in an MCP server's pool.",
            ("server",),
            namespace=METRICS_NAMESPACE,
            registry=registry,
        )
        self.start_seconds = Histogram(
            "mcp_instance_start_seconds",
            "Time from starting an instance of an MCP server to its tools listed.",
            ("server",),
            namespace=METRICS_NAMESPACE,
            registry=registry,
            buckets=START_BUCKETS_S,
        )


@dataclass(eq=False)
class _Instance:
    server: McpServer
    scope: Scope
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    in_flight: int = 0
    calls: int = 0
    idle_timer: asyncio.TimerHandle | None = None
    ending: InstanceStopReason | None = None
    """Why it stops once its calls in flight are answered (its session ended)."""
    announced: asyncio.Task[None] | None = None
    """Records its start once it answers."""
    recorded: bool = False
    """Whether its start was recorded (then its stop is too)."""


Publish = Callable[[str, Payload], Awaitable[None]]


class ServerPool:
    """One server's instances and the calls in flight on them."""

    def __init__(
        self,
        listing: McpServer,
        publish: Publish,
        metrics: PoolMetrics,
        gateway: str,
        last_record: Callable[[str], Awaitable[Payload | None]],
    ) -> None:
        """`listing`: the federation's connection to the server (a shared server's one
        instance); `last_record`: the newest `mcp.instance.*` event on a subject."""
        self.config: ServerConfig = listing.config
        self._listing = listing
        self._publish = publish
        self._metrics = metrics
        self._gateway = gateway
        self._last_record = last_record
        self._instances: dict[Scope, _Instance] = {}
        if self.config.isolation == "shared":
            self._instances[SHARED] = _Instance(listing, SHARED)
        self._in_flight = 0
        self._queued = 0
        self._changed = asyncio.Condition()
        self._stopping: set[asyncio.Task[None]] = set()
        self._label = self.config.id

    def scope_of(self, tenant: str, session_id: str) -> Scope:
        """Whom an instance serving this call serves, by the server's isolation."""
        match self.config.isolation:
            case "shared":
                return SHARED
            case "tenant":
                return Scope(tenant, None)
            case "session":
                return Scope(tenant, session_id)

    @contextlib.asynccontextmanager
    async def lease(self, tenant: str, session_id: str) -> AsyncIterator[McpServer]:
        """A place for one call on the instance that serves it (started if there is none
        yet), held until the block ends; raises `PoolFull` when no place frees in time."""
        instance = await self._admitted(self.scope_of(tenant, session_id))
        try:
            yield instance.server
        finally:
            await self._release(instance)

    async def session_ended(self, tenant: str, session_id: str) -> None:
        """Stop the session's instance, once its calls in flight are answered."""
        if self.config.isolation != "session":
            return
        async with self._changed:
            instance = self._instances.pop(Scope(tenant, session_id), None)
            if instance is None:
                return
            instance.ending = "session_ended"
            if instance.in_flight == 0:
                self._stop_later(instance, "session_ended")
            self._changed.notify_all()

    async def stop(self) -> None:
        """Stop every instance of its own (the gateway is stopping)."""
        if self.config.isolation != "shared":
            async with self._changed:
                instances, self._instances = list(self._instances.values()), {}
            for instance in instances:
                self._stop_later(instance, "gateway_stopping")
        while self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    async def _admitted(self, scope: Scope) -> _Instance:
        pool = self.config.pool
        began = time.monotonic()
        deadline = began + pool.queue_timeout_s
        queued = False
        async with self._changed:
            try:
                while (instance := self._take(scope)) is None:
                    if not queued:
                        if self._queued >= pool.queue:
                            raise self._full(scope, "queue_full")
                        queued = True
                        self._queued += 1
                        self._metrics.queued.labels(self._label).inc()
                    try:
                        await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
                    except TimeoutError:
                        raise self._full(scope, "waited") from None
            finally:
                if queued:
                    self._queued -= 1
                    self._metrics.queued.labels(self._label).dec()
                    self._metrics.waited.labels(self._label).observe(time.monotonic() - began)
        if instance.announced is not None and not instance.announced.done():
            # A new instance's calls wait for it to answer (the SDK would wait anyway), so
            # that its start is recorded before them.
            await asyncio.wait({instance.announced}, timeout=self.config.timeout_s)
        return instance

    def _take(self, scope: Scope) -> _Instance | None:
        """A place on the scope's instance, started if it has none, if the caps allow."""
        pool = self.config.pool
        if self._in_flight >= pool.max_calls:
            return None
        instance = self._instances.get(scope)
        if instance is None:
            if len(self._instances) >= pool.max_instances:
                return None
            instance = self._instances[scope] = self._start(scope)
        elif instance.in_flight >= pool.calls_per_instance:
            return None
        if instance.idle_timer is not None:
            instance.idle_timer.cancel()
            instance.idle_timer = None
        instance.in_flight += 1
        instance.calls += 1
        self._in_flight += 1
        self._metrics.in_flight.labels(self._label).inc()
        return instance

    async def _release(self, instance: _Instance) -> None:
        async with self._changed:
            instance.in_flight -= 1
            self._in_flight -= 1
            self._metrics.in_flight.labels(self._label).dec()
            if instance.in_flight == 0 and instance.scope != SHARED:
                if instance.ending is not None:
                    self._stop_later(instance, instance.ending)
                else:
                    instance.idle_timer = asyncio.get_running_loop().call_later(
                        self.config.pool.idle_s, self._idle, instance
                    )
            self._changed.notify_all()

    def _full(self, scope: Scope, why: str) -> PoolFull:
        pool = self.config.pool
        self._metrics.refused.labels(self._label, why).inc()
        # With every instance taken and idle ones among them, a place frees when the first
        # of those is stopped; otherwise when a call ends, which nothing tells in advance.
        idle_ends = [
            instance.idle_timer.when() - asyncio.get_running_loop().time()
            for instance in self._instances.values()
            if instance.idle_timer is not None
        ]
        capped = scope not in self._instances and len(self._instances) >= pool.max_instances
        retry_in_s = max(0.0, min(idle_ends)) if capped and idle_ends else pool.queue_timeout_s
        waited = (
            "its queue is full"
            if why == "queue_full"
            else (f"no place freed within {pool.queue_timeout_s:g} s")
        )
        return PoolFull(
            ToolError(
                kind="rate_limited",
                message=f"MCP server {self.config.id} is busy, and the call was not sent: "
                f"{waited} ({len(self._instances)} of {pool.max_instances} instances, "
                f"{self._in_flight} of {pool.max_calls} calls in flight, {self._queued} of "
                f"{pool.queue} queued)",
                retryable=True,
                suggestion=f"try again in {retry_in_s:.0f} s, or use another tool",
            ),
            retry_in_s,
        )

    def _start(self, scope: Scope) -> _Instance:
        server = McpServer(self.config, lambda: None)
        instance = _Instance(server, scope)
        server.start()
        self._metrics.instances.labels(self._label).inc()
        instance.announced = asyncio.create_task(self._announce(instance, time.monotonic()))
        logger.info("MCP server %s: instance %s started for %s", self.config.id, instance.id, scope)
        return instance

    async def _announce(self, instance: _Instance, began: float) -> None:
        """Record the instance's start once it answers."""
        await instance.server.connected.wait()
        start_s = time.monotonic() - began
        self._metrics.start_seconds.labels(self._label).observe(start_s)
        about = self._about(instance)
        subject = mcp_instance_subject(self.config.id, about.tenant, about.session_id)
        previous = await self._last_record(subject)
        replaces = (
            previous.instance.id
            if isinstance(previous, McpInstanceStarted)
            and previous.instance.gateway != self._gateway
            else None
        )
        await self._publish(
            subject, McpInstanceStarted(instance=about, start_ms=start_s * 1000, replaces=replaces)
        )
        instance.recorded = True

    def _about(self, instance: _Instance) -> McpInstance:
        tenant, session_id = instance.scope
        return McpInstance(
            server=self.config.id,
            id=instance.id,
            isolation=self.config.isolation,
            tenant=tenant,
            session_id=session_id,
            gateway=self._gateway,
        )

    def _idle(self, instance: _Instance) -> None:
        if self._instances.get(instance.scope) is instance and instance.in_flight == 0:
            del self._instances[instance.scope]
            self._stop_later(instance, "idle")

    def _stop_later(self, instance: _Instance, reason: InstanceStopReason) -> None:
        task = asyncio.create_task(self._stop(instance, reason))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop(self, instance: _Instance, reason: InstanceStopReason) -> None:
        if instance.idle_timer is not None:
            instance.idle_timer.cancel()
        if instance.announced is not None and not instance.announced.done():
            instance.announced.cancel()
        await instance.server.stop()
        self._metrics.instances.labels(self._label).dec()
        async with self._changed:
            self._changed.notify_all()  # An instance's place is free.
        logger.info("MCP server %s: instance %s stopped (%s)", self.config.id, instance.id, reason)
        if not instance.recorded:
            return
        about = self._about(instance)
        try:
            await self._publish(
                mcp_instance_subject(self.config.id, about.tenant, about.session_id),
                McpInstanceStopped(instance=about, reason=reason, calls=instance.calls),
            )
        except Exception as error:
            # The instance is gone either way; a gateway that later serves the session names
            # it in `replaces`, which says as much.
            logger.warning("could not record instance %s stopped: %s", instance.id, error)


class Instances:
    """Every federated server's pool."""

    def __init__(
        self,
        store: EventStore,
        servers: dict[str, McpServer],
        *,
        source: str,
        gateway: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._store = store
        self._source = source
        metrics = PoolMetrics(registry)
        self.pools = {
            server_id: ServerPool(server, self._publish, metrics, gateway, self._last_record)
            for server_id, server in servers.items()
        }

    async def session_ended(self, tenant: str, session_id: str) -> None:
        """Stop the instances kept for a session that ended."""
        for pool in self.pools.values():
            await pool.session_ended(tenant, session_id)

    async def stop(self) -> None:
        """Stop every instance of a tenant or session."""
        for pool in self.pools.values():
            await pool.stop()

    async def _publish(self, subject: str, data: Payload) -> None:
        event = new_event(
            data,
            tenant=TOOLS_TENANT,
            session_id=TOOLS_SESSION,
            source=self._source,
            event_id=uuid.uuid4(),
        )
        await self._store.publish(subject, event)

    async def _last_record(self, subject: str) -> Payload | None:
        try:
            message = await self._store.js.get_last_msg(TOOLS_STREAM.name, subject)
        except NotFoundError:
            return None
        assert message.data is not None
        return decode_event(message.data).data
