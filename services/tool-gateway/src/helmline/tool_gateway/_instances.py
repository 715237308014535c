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

An instance runs in the gateway process that started it. Another process handed a call of
its tenant or session finds it by the newest record and hands the call to it there
(`_forwarding`); when nobody answers for it (its process died), that process starts an
instance of its own, which `replaces` it. Two processes handed a new session's first calls
at the same moment may both start one: the newer record wins the later calls, and the other
instance idles out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import NamedTuple

from cachetools import LRUCache
from nats.aio.client import Client as NATS
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
from helmline.tool_gateway._forwarding import Answering, CallsTools, PoolFull, RemoteInstance
from helmline.tool_gateway._mcp import McpServer, ServerUnavailable

logger = logging.getLogger(__name__)

REMOTES_KNOWN = 10_000
"""Tenants and sessions whose instance in another gateway process this one remembers."""
START_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)


class Scope(NamedTuple):
    """Whom an instance serves: a tenant, a tenant's session, or (both None) everyone."""

    tenant: str | None
    session_id: str | None


SHARED = Scope(None, None)


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
        self.egress_refused = Counter(
            "mcp_egress_refused",
            "Connections a sandboxed MCP server's instance was refused while serving a call "
            "of a tool (its sandbox allows some hosts, not these), as recorded on the calls.",
            ("server", "tool"),
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
    answering: Answering | None = None
    """Takes the calls other gateway processes hand to it."""


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
        about: MutableMapping[str, str],
        nc: NATS | None,
    ) -> None:
        """`listing`: the federation's connection to the server (a shared server's one
        instance); `last_record`: the newest `mcp.instance.*` event on a subject; `about`:
        where an isolated server's instances are counted for `/readyz` (`helmline status`);
        `nc`: the connection calls are handed to other gateway processes over (none: each
        process starts instances of its own)."""
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
        self._about = about
        self._nc = nc
        self._remotes: LRUCache[Scope, RemoteInstance] = LRUCache(REMOTES_KNOWN)
        self._show_instances()

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
    async def lease(self, tenant: str, session_id: str) -> AsyncIterator[CallsTools]:
        """A place for one call on the instance that serves it: the one another gateway
        process runs, if one does; else this process's (started if there is none yet), held
        until the block ends. Raises `PoolFull` when no place frees in time."""
        scope = self.scope_of(tenant, session_id)
        remote = await self._remote(scope)
        if remote is not None:
            yield remote  # Its process's pool counts the call.
            return
        instance = await self._admitted(scope)
        try:
            yield instance.server
        finally:
            await self._release(instance)

    @contextlib.asynccontextmanager
    async def _lease_on(self, instance: _Instance) -> AsyncIterator[CallsTools]:
        """A place for a call another process handed to `instance`."""
        taken = await self._admitted(instance.scope, only=instance)
        try:
            yield taken.server
        finally:
            await self._release(taken)

    async def _remote(self, scope: Scope) -> RemoteInstance | None:
        """The instance for `scope` that another gateway process runs, if one answers."""
        if scope == SHARED or self._nc is None or scope in self._instances:
            return None
        known = self._remotes.get(scope)
        if known is not None and not known.gone:
            return known
        record = await self._last_record(mcp_instance_subject(self.config.id, *scope))
        if not isinstance(record, McpInstanceStarted) or record.instance.gateway == self._gateway:
            return None
        remote = RemoteInstance(self._nc, record.instance.id)
        if not await remote.alive():
            return None  # Gone with its process: this one starts one, which replaces it.
        self._remotes[scope] = remote
        logger.info(
            "MCP server %s: calls for %s handed to instance %s in gateway process %s",
            self.config.id,
            scope,
            remote.instance,
            record.instance.gateway,
        )
        return remote

    async def session_ended(self, tenant: str, session_id: str) -> None:
        """Stop the session's instance, once its calls in flight are answered: here, or in
        the gateway process that runs it."""
        if self.config.isolation != "session":
            return
        scope = Scope(tenant, session_id)
        instance = self._instances.get(scope)
        if instance is not None:
            await self._end(instance)
            return
        remote = await self._remote(scope)
        if remote is not None:
            await remote.end()

    async def _end(self, instance: _Instance) -> None:
        async with self._changed:
            if self._instances.get(instance.scope) is not instance:
                return
            del self._instances[instance.scope]
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

    async def _admitted(self, scope: Scope, only: _Instance | None = None) -> _Instance:
        """A place on the scope's instance (`only` that one, not another started after it
        stopped)."""
        pool = self.config.pool
        began = time.monotonic()
        deadline = began + pool.queue_timeout_s
        queued = False
        async with self._changed:
            try:
                while True:
                    if only is not None and self._instances.get(scope) is not only:
                        raise ServerUnavailable("its instance was stopped")
                    instance = self._take(scope)
                    if instance is not None:
                        break
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
            self._show_instances()
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
        # Started as the listing connection was: in the same sandbox, with its secrets.
        server = McpServer(self.config, lambda: None, self._listing.launcher)
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
        if self._nc is not None:
            # Before its start is recorded: whoever reads the record finds it answering.
            instance.answering = Answering(
                self._nc, instance.id, lambda: self._lease_on(instance), lambda: self._end(instance)
            )
            await instance.answering.start()
        about = self._record_of(instance)
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

    def _show_instances(self) -> None:
        isolation = self.config.isolation
        if isolation == "shared":
            return
        most = self.config.pool.max_instances
        self._about[f"MCP server {self.config.id} instances"] = (
            f"{len(self._instances)} running of at most {most} (one per {isolation})"
        )

    def _record_of(self, instance: _Instance) -> McpInstance:
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
        if instance.answering is not None:
            await instance.answering.stop()
        await instance.server.stop()
        self._metrics.instances.labels(self._label).dec()
        self._show_instances()
        async with self._changed:
            self._changed.notify_all()  # An instance's place is free.
        logger.info("MCP server %s: instance %s stopped (%s)", self.config.id, instance.id, reason)
        if not instance.recorded:
            return
        about = self._record_of(instance)
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
        about: MutableMapping[str, str] | None = None,
        nc: NATS | None = None,
    ) -> None:
        """`registry`: where the pools' figures go (the service's `/metrics`); `about`: the
        service's facts for `/readyz`; `nc`: the connection calls are handed to other
        gateway processes over (none: each process starts instances of its own)."""
        self._store = store
        self._source = source
        metrics = PoolMetrics(registry)
        self.metrics = metrics
        """The pools' figures, and the egress refusals recorded on calls."""
        self.pools = {
            server_id: ServerPool(
                server,
                self._publish,
                metrics,
                gateway,
                self._last_record,
                about if about is not None else {},
                nc,
            )
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
