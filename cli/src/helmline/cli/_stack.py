"""`up`, `down` and `status` for the stack of one data folder."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

from helmline.cli._catalogue import ServiceName
from helmline.cli._errors import INVALID_INPUT, CliError, StartupError
from helmline.cli._nats import ADMIN, ClusterNode, NatsUsers, nats_is_healthy, start_nats
from helmline.cli._postgres import postgres_is_healthy, start_postgres, stop_postgres
from helmline.cli._processes import (
    is_running,
    log_tail,
    reaped,
    record_of,
    spawn,
    spawn_detached,
    stop_processes,
    wait_until,
)
from helmline.cli._record import (
    LOGS_DIR,
    NATS_STORE_DIR,
    PGDATA_DIR,
    ComponentRecord,
    ProcessRecord,
    StackRecord,
    read_record,
    remove_record,
    stack_lock,
    update_record,
    write_record,
)
from helmline.cli._services import service_readiness
from helmline.cli._settings import CliSettings
from helmline.cli._supervisor import ServiceLaunch, SupervisorPlan
from helmline.runtime import (
    SEALING_KEY_FILE,
    SECRETS_KEY_FILE,
    SealingKey,
    reserve_ports,
    without_credentials,
)

Health = Literal["healthy", "unhealthy", "stopped"]

NATS = "nats"
POSTGRES = "postgres"
SUPERVISOR = "supervisor"


class StartupObserver(Protocol):
    """Told about each step of `up` as it happens (the terminal shows progress with it)."""

    def begin(self, step: str, detail: str = "") -> None: ...

    def done(self, step: str, detail: str = "") -> None: ...

    def note(self, message: str) -> None: ...


@dataclass(frozen=True)
class ComponentStatus:
    component: ComponentRecord
    health: Health
    about: Mapping[str, str] = field(default_factory=dict)
    """What a service says of how it runs."""


@dataclass(frozen=True)
class StackStatus:
    data_dir: Path
    record: StackRecord | None
    components: tuple[ComponentStatus, ...]

    @property
    def running(self) -> bool:
        return self.record is not None

    @property
    def healthy(self) -> bool:
        return (
            self.record is not None
            and self.record.complete
            and all(c.health == "healthy" for c in self.components)
        )


@dataclass(frozen=True)
class UpResult:
    status: StackStatus
    already_running: bool
    seconds: float


def stack_status(settings: CliSettings) -> StackStatus:
    data_dir = settings.resolved_data_dir()
    record = read_record(data_dir)
    if record is None:
        return StackStatus(data_dir=data_dir, record=None, components=())
    return _evaluate(record)


def up(settings: CliSettings, environ: Mapping[str, str], observer: StartupObserver) -> UpResult:
    """Start the data folder's stack; or, when one runs there, start again only what of it
    has stopped (on the ports it had) and report it."""
    began = time.monotonic()
    deadline = began + settings.startup_timeout
    data_dir = settings.resolved_data_dir()
    options = _options(settings, environ)
    with stack_lock(data_dir):
        existing = read_record(data_dir)
        if existing is not None and existing.complete:
            _refuse_other_options(existing, options)
            status = _evaluate(existing)
            if not status.healthy:
                _repair(settings, existing, environ, observer, deadline=deadline)
                status = _wait_until_healthy(existing.data_dir, deadline=deadline)
            return UpResult(status, already_running=True, seconds=time.monotonic() - began)
        if existing is not None:
            # An incomplete record is an `up` that was interrupted: this one holds the lock.
            observer.note(f"cleaning up a stale stack in {data_dir}")
            _stop(existing, grace=settings.stop_grace)
            remove_record(data_dir)
        record = _start(settings, data_dir, environ, options, observer, deadline=deadline)
        return UpResult(_evaluate(record), already_running=False, seconds=time.monotonic() - began)


def down(settings: CliSettings) -> StackRecord | None:
    """Stop everything the data folder's stack started; None when nothing was running."""
    data_dir = settings.resolved_data_dir()
    with stack_lock(data_dir):
        record = read_record(data_dir)
        if record is None:
            return None
        _stop(record, grace=settings.stop_grace)
        remove_record(data_dir)
        return record


class _Ledger:
    """The record of a stack being started, on disk after every change so that an
    interrupted `up` leaves behind what `down` needs to stop its processes. The supervisor
    writes it too (the processes it starts), so every change is read, changed, written."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    @classmethod
    def begin(cls, record: StackRecord) -> _Ledger:
        """The ledger of a new stack, whose record is written now."""
        write_record(record)
        return cls(record.data_dir)

    @property
    def record(self) -> StackRecord:
        return _current(self.data_dir)

    def add(self, component: ComponentRecord, **updates: object) -> None:
        update_record(
            self.data_dir,
            lambda record: record.with_component(component).model_copy(update=updates),
        )

    def update(self, **updates: object) -> None:
        update_record(self.data_dir, lambda record: record.model_copy(update=updates))


@dataclass(frozen=True)
class _Ports:
    nats: tuple[int, ...]
    """Each embedded NATS server's client port; none when an external NATS is used."""
    nodes: tuple[ClusterNode, ...]
    """The servers of an embedded cluster, none for a single server."""
    postgres: int | None
    """None when an external PostgreSQL is used."""
    api: tuple[int, ...]
    """Each API replica's."""
    health: Mapping[str, int]
    """Each service process's, by component name."""


def _component_names(replicas: int) -> list[tuple[ServiceName, str]]:
    """Each service process as (service, component name): `planner`, or `planner-1`,
    `planner-2` ... with replicas."""
    if replicas == 1:
        return [(service, service.value) for service in ServiceName]
    return [
        (service, f"{service.value}-{index}")
        for service in ServiceName
        for index in range(1, replicas + 1)
    ]


def _choose_ports(settings: CliSettings, replicas: int) -> _Ports:
    names = [name for _, name in _component_names(replicas)]
    servers = settings.nats_cluster or 1
    clustered = servers > 1
    # One reservation for all, so no two components are handed the same free port.
    free = iter(reserve_ports(2 * servers + 1 + replicas + len(names)))

    def pick(given: int | None) -> int:
        return given if given is not None else next(free)

    nats: tuple[int, ...] = ()
    nodes: tuple[ClusterNode, ...] = ()
    if settings.nats_url is None:
        nats = (pick(settings.nats_port), *(next(free) for _ in range(servers - 1)))
        if clustered:
            routes = [next(free) for _ in range(servers)]
            nodes = tuple(
                ClusterNode(index, route, tuple(p for p in routes if p != route))
                for index, route in enumerate(routes, start=1)
            )
    return _Ports(
        nats=nats,
        nodes=nodes,
        postgres=pick(settings.pg_port) if settings.database_url is None else None,
        api=(pick(settings.api_port), *(next(free) for _ in range(replicas - 1))),
        health={name: next(free) for name in names},
    )


def _options(settings: CliSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """What this `up` asks of how the stack runs, as the record keeps it: only what was
    given (an option or its variable), so that a later plain `up` asks nothing."""
    asked = {
        "--api-port": settings.api_port,
        "--nats-port": settings.nats_port,
        "--pg-port": settings.pg_port,
        "--replicas": settings.replicas,
        "--nats-cluster": settings.nats_cluster,
        "--policy": environ.get("HELMLINE_POLICY"),
        "--mcp-servers": environ.get("HELMLINE_MCP_SERVERS"),
    }
    return {option: str(value) for option, value in asked.items() if value is not None}


def _refuse_other_options(record: StackRecord, asked: Mapping[str, str]) -> None:
    differing = [
        f"{option} {value} (it runs with {record.options.get(option, 'none')})"
        for option, value in asked.items()
        if record.options.get(option) != value
    ]
    if differing:
        raise CliError(
            f"a stack runs from {record.data_dir} otherwise than asked: "
            + "; ".join(differing)
            + ". Run `helmline down` first to change how it runs, or leave those out",
            exit_code=INVALID_INPUT,
        )


def _start(
    settings: CliSettings,
    data_dir: Path,
    environ: Mapping[str, str],
    options: Mapping[str, str],
    observer: StartupObserver,
    *,
    deadline: float,
) -> StackRecord:
    logs = data_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    if not _secrets_key_given(environ):
        # Kept beside the data, never in NATS: what the stack's secrets are sealed with.
        SealingKey.kept_in(data_dir / SECRETS_KEY_FILE)
    # Made once and kept: the raw outputs sealed with it open only with it.
    SealingKey.kept_in(data_dir / SEALING_KEY_FILE)
    replicas = settings.replicas or 1
    ports = _choose_ports(settings, replicas)
    users = NatsUsers.generate() if ports.nats else None
    ledger = _Ledger.begin(
        StackRecord(
            data_dir=data_dir,
            started_at=datetime.now(UTC),
            nats_url=_nats_url(settings, ports, users, ADMIN),
            database_url=settings.database_url or "",
            api_url=f"http://127.0.0.1:{ports.api[0]}",
            options={
                **options,
                # As chosen: a later `up` restarting a part uses the same ones.
                "--api-port": str(ports.api[0]),
                "--replicas": str(replicas),
                "--nats-cluster": str(len(ports.nodes) or 1),
            },
            durability=settings.durability if ports.nats else None,
        )
    )
    try:
        _start_servers(settings, ledger, ports, users, environ, observer, deadline=deadline)
        _provision(
            ledger.record.nats_url,
            observer,
            replicas=_stream_replicas(ledger.record),
            deadline=deadline,
        )
        api_ports = iter(ports.api)
        for service, name in _component_names(replicas):
            observer.begin(name, "starting")
            health = ports.health[name]
            address = (
                f"http://127.0.0.1:{next(api_ports)}"
                if service is ServiceName.API
                else f"http://127.0.0.1:{health}"
            )
            ledger.add(
                ComponentRecord(
                    name=name,
                    kind="service",
                    service=service.value,
                    address=address,
                    health_port=health,
                    log=logs / f"{name}.log",
                )
            )
        _start_supervisor(settings, ledger, environ)
        _wait_for_services(ledger, observer, deadline=deadline)
        ledger.update(complete=True)
    except BaseException:
        # A half-started stack is worse than none: stop what did start, keep the logs.
        _stop(ledger.record, grace=settings.stop_grace)
        remove_record(data_dir)
        raise
    return ledger.record


def _start_supervisor(settings: CliSettings, ledger: _Ledger, environ: Mapping[str, str]) -> None:
    """Start the supervisor, which starts (or adopts) every service process of the record."""
    record = ledger.record
    users = _nats_users(record)
    plan = SupervisorPlan(
        data_dir=record.data_dir,
        services=[
            _launch(record, component, users, environ) for component in record.of_kind("service")
        ],
        grace_s=settings.stop_grace,
    )
    log = record.data_dir / LOGS_DIR / f"{SUPERVISOR}.log"
    read, write = os.pipe()
    try:
        # The plan holds every service's credentials: it goes through a pipe, not a file.
        child = spawn(
            [sys.executable, "-m", "helmline.cli", "supervise"],
            log=log,
            env=environ,
            cwd=record.data_dir,
            stdin=read,
        )
    finally:
        os.close(read)
    with os.fdopen(write, "wb") as pipe:
        pipe.write(plan.model_dump_json().encode())
    earlier = next((c for c in record.components if c.name == SUPERVISOR), None)
    ledger.add(
        ComponentRecord(
            name=SUPERVISOR,
            kind="supervisor",
            address=f"{len(plan.services)} service processes",
            process=record_of(child),
            log=log,
            restarts=earlier.restarts + 1 if earlier is not None else 0,
            last_start=datetime.now(UTC),
        )
    )


def _launch(
    record: StackRecord,
    component: ComponentRecord,
    users: NatsUsers | None,
    environ: Mapping[str, str],
) -> ServiceLaunch:
    """How to start a service process of the record: the same way whenever it starts."""
    assert component.service is not None
    assert component.health_port is not None
    service = ServiceName(component.service)
    env = {
        **environ,
        "HELMLINE_DATABASE_URL": record.database_url,
        "HELMLINE_DATA_DIR": str(record.data_dir),
        "HELMLINE_HEALTH_PORT": str(component.health_port),
        "HELMLINE_NATS_URL": users.urls(_embedded_nats_ports(record), service.value)
        if users is not None
        else record.nats_url,
        "HELMLINE_STREAM_REPLICAS": str(_stream_replicas(record)),
    }
    if not _secrets_key_given(environ):
        env["HELMLINE_SECRETS_KEY_FILE"] = str(record.data_dir / SECRETS_KEY_FILE)
    if "--policy" in record.options:
        env["HELMLINE_POLICY"] = record.options["--policy"]
    if "--mcp-servers" in record.options:
        env["HELMLINE_MCP_SERVERS"] = record.options["--mcp-servers"]
    if service is ServiceName.API:
        env["HELMLINE_API_PORT"] = str(_port_of(component.address))
    if service is ServiceName.TOOL_GATEWAY and "HELMLINE_SEALING_KEY" not in environ:
        env.setdefault("HELMLINE_SEALING_KEY_FILE", str(record.data_dir / SEALING_KEY_FILE))
    return ServiceLaunch(
        name=component.name,
        service=service.value,
        # The same interpreter as this command, so the service runs from the same
        # environment whatever PATH holds.
        argv=[sys.executable, "-m", "helmline.cli", "serve", service.value],
        env=env,
        cwd=record.data_dir,
        log=component.log or record.data_dir / LOGS_DIR / f"{component.name}.log",
        health_port=component.health_port,
        address=component.address,
    )


def _secrets_key_given(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("HELMLINE_SECRETS_KEY") or environ.get("HELMLINE_SECRETS_KEY_FILE"))


def _nats_users(record: StackRecord) -> NatsUsers | None:
    """The embedded servers' users, as their configuration holds them; None for an
    external NATS."""
    first = record.of_kind("nats")[0].process
    if first is None:
        return None
    return NatsUsers.read(Path(first.argv[first.argv.index("--config") + 1]))


def _embedded_nats_ports(record: StackRecord) -> list[int]:
    return [_port_of(c.address) for c in record.of_kind("nats")]


def _stream_replicas(record: StackRecord) -> int:
    """On how many servers each stream is kept: all of an embedded cluster's, up to three."""
    return min(3, int(record.options.get("--nats-cluster", "1")))


def _port_of(url: str) -> int:
    port = urlsplit(url.split(",")[0]).port
    assert port is not None, url
    return port


def _repair(
    settings: CliSettings,
    record: StackRecord,
    environ: Mapping[str, str],
    observer: StartupObserver,
    *,
    deadline: float,
) -> None:
    """Start again what of a running stack has stopped, each on the port it had; services
    are the supervisor's to restart, and the supervisor is started again if it is gone."""
    logs = record.data_dir / LOGS_DIR
    for component in record.components:
        if component.process is None or is_running(component.process):
            continue
        match component.kind:
            case "nats":
                observer.begin(component.name, "restarting")
                process = spawn_detached(
                    component.process.argv,
                    log=component.log or logs / f"{component.name}.log",
                    env=environ,
                    cwd=record.data_dir,
                )
                _restarted(record.data_dir, component, process)
            case "postgres":
                observer.begin(component.name, "restarting")
                # A killed postmaster's pid stays taken until its parent (init) reaps it, and
                # PostgreSQL will not start over a pid file whose pid is taken.
                wait_until(
                    functools.partial(reaped, component.process),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                process, _ = start_postgres(
                    pgdata=record.data_dir / PGDATA_DIR,
                    port=_port_of(component.address),
                    log=logs / "postgres.log",
                    timeout=max(1.0, deadline - time.monotonic()),
                )
                _restarted(record.data_dir, component, process)
            case "supervisor":
                observer.begin(component.name, "restarting")
                _start_supervisor(settings, _Ledger(record.data_dir), environ)
                observer.done(component.name, component.address)
            case "service":
                pass  # The supervisor's to restart.
    for kind in ("nats", "postgres"):
        for component in _current(record.data_dir).of_kind(kind):
            _wait_for(component, deadline=deadline)
            observer.done(component.name, component.address)


def _restarted(data_dir: Path, component: ComponentRecord, process: ProcessRecord) -> None:
    update_record(
        data_dir,
        lambda record: record.with_component(
            component.model_copy(
                update={
                    "process": process,
                    "restarts": component.restarts + 1,
                    "last_start": datetime.now(UTC),
                }
            )
        ),
    )


def _current(data_dir: Path) -> StackRecord:
    """The record as it is on disk now (the supervisor writes it too)."""
    record = read_record(data_dir)
    assert record is not None, "the stack record was removed"
    return record


def _wait_until_healthy(data_dir: Path, *, deadline: float) -> StackStatus:
    """The stack's status once everything is healthy; raises what is not, by the deadline."""
    status = _evaluate(_current(data_dir))

    def healthy() -> bool:
        nonlocal status
        status = _evaluate(_current(data_dir))
        return status.healthy

    if not wait_until(healthy, timeout=max(0.0, deadline - time.monotonic())):
        unhealthy = ", ".join(c.component.name for c in status.components if c.health != "healthy")
        raise CliError(
            f"the stack in {data_dir} is running but not healthy ({unhealthy}); "
            f"see {data_dir / LOGS_DIR}, or run `helmline down` and try again"
        )
    return status


def _nats_url(settings: CliSettings, ports: _Ports, users: NatsUsers | None, user: str) -> str:
    """Where `user` (admin or a service) connects: to the embedded server as itself, or to the
    external NATS with the credentials its URL holds."""
    if settings.nats_url is not None:
        return settings.nats_url
    assert users is not None
    return users.urls(ports.nats, user)


def _start_servers(
    settings: CliSettings,
    ledger: _Ledger,
    ports: _Ports,
    users: NatsUsers | None,
    environ: Mapping[str, str],
    observer: StartupObserver,
    *,
    deadline: float,
) -> None:
    data_dir = ledger.record.data_dir
    logs = data_dir / LOGS_DIR
    if ports.nats and users is not None:
        nodes: tuple[ClusterNode | None, ...] = ports.nodes or (None,)
        for port, node in zip(ports.nats, nodes, strict=True):
            name = NATS if node is None else node.name
            observer.begin(name, "starting")
            log = logs / f"{name}.log"
            process = start_nats(
                store_dir=data_dir / NATS_STORE_DIR / ("" if node is None else node.name),
                port=port,
                users=users,
                durability=settings.durability,
                log=log,
                env=environ,
                cwd=data_dir,
                node=node,
            )
            ledger.add(
                ComponentRecord(
                    name=name,
                    kind="nats",
                    address=f"nats://127.0.0.1:{port}",
                    process=process,
                    log=log,
                )
            )
    else:
        observer.begin(NATS, "external")
        ledger.add(ComponentRecord(name=NATS, kind="nats", address=ledger.record.nats_url))
        # Checked before PostgreSQL is started for nothing.
        _wait_for(_component(ledger.record, NATS), deadline=deadline)

    # PostgreSQL starts while nats-server is still coming up: both take a moment.
    if ports.postgres is not None:
        observer.begin(POSTGRES, "starting")
        process, url = start_postgres(
            pgdata=data_dir / PGDATA_DIR,
            port=ports.postgres,
            log=logs / "postgres.log",
            timeout=max(1.0, deadline - time.monotonic()),
        )
        ledger.add(
            ComponentRecord(
                name=POSTGRES,
                kind="postgres",
                address=url,
                process=process,
                log=logs / "postgres.log",
            ),
            database_url=url,
        )
    else:
        observer.begin(POSTGRES, "external")
        ledger.add(
            ComponentRecord(name=POSTGRES, kind="postgres", address=ledger.record.database_url)
        )

    for component in (*ledger.record.of_kind("postgres"), *ledger.record.of_kind("nats")):
        _wait_for(component, deadline=deadline)
        observer.done(component.name, component.address)


def _provision(nats_url: str, observer: StartupObserver, *, replicas: int, deadline: float) -> None:
    # Imported here: the runtime pulls in the NATS client, which only this step needs.
    from helmline.runtime import provision

    observer.begin("streams", "provisioning" + (f" (R{replicas})" if replicas > 1 else ""))
    timeout = max(1.0, deadline - time.monotonic())
    try:
        asyncio.run(asyncio.wait_for(_provision_when_ready(provision, nats_url, replicas), timeout))
    except TimeoutError as error:
        raise StartupError(
            f"provisioning JetStream at {without_credentials(nats_url)} took over {timeout:.0f} s"
        ) from error
    except Exception as error:
        # Whatever the runtime raises, the person needs the server and the reason, not a
        # traceback through asyncio.
        raise StartupError(
            f"could not provision JetStream at {without_credentials(nats_url)}: {error!r}"
        ) from error
    observer.done("streams", "provisioned")


async def _provision_when_ready(
    provision: Callable[..., Awaitable[object]], nats_url: str, replicas: int
) -> None:
    """Provision once JetStream answers: a new cluster first elects its leader, and until
    then answers that it is unavailable (or not at all)."""
    import nats.errors
    import nats.js.errors

    while True:
        try:
            await provision(nats_url, replicas=replicas)
            return
        except (
            nats.js.errors.ServiceUnavailableError,
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
        ):
            if replicas == 1:
                raise  # A single server has no leader to wait for.
            await asyncio.sleep(_CLUSTER_RETRY_S)
        except nats.js.errors.BadRequestError as error:
            # "no suitable peers for placement": not every server has joined yet.
            if replicas == 1 or error.err_code != _NO_PEERS_YET:
                raise
            await asyncio.sleep(_CLUSTER_RETRY_S)


_CLUSTER_RETRY_S = 0.2
_STARTUP_TRIES = 3
"""Starts of a service during `up` before its exits fail `up`."""
_NO_PEERS_YET = 10005


def _wait_for(component: ComponentRecord, *, deadline: float) -> None:
    if component.process is None:
        # An external server is either there or not; it is not starting up.
        if _health(component) != "healthy":
            raise StartupError(
                f"{component.name} at {without_credentials(component.address)} does not answer"
                + (" with JetStream enabled" if component.kind == "nats" else "")
            )
        return

    wait_until(
        lambda: _health(component) != "unhealthy", timeout=max(0.0, deadline - time.monotonic())
    )
    health = _health(component)
    if health != "healthy":
        raise _not_ready(component, health)


def _wait_for_services(ledger: _Ledger, observer: StartupObserver, *, deadline: float) -> None:
    pending = {c.name for c in ledger.record.of_kind("service")}
    supervisor = _component(ledger.record, SUPERVISOR)

    def progressed() -> bool:
        if _health(supervisor) == "stopped":
            raise _not_ready(supervisor, "stopped")
        # Read anew each time: the supervisor records the processes it starts.
        for component in ledger.record.of_kind("service"):
            if component.name not in pending:
                continue
            if component.last_exit_code is not None and component.restarts >= _STARTUP_TRIES - 1:
                # The supervisor would start it again and again: a service that cannot start
                # fails `up`, with its log. One exit may be the moment (a JetStream request
                # timing out while a cluster settles); the supervisor's restart rides it out.
                raise _not_ready(component, "stopped")
            if _health(component) == "healthy":
                observer.done(component.name, component.address)
                pending.discard(component.name)
        return not pending

    if not wait_until(progressed, timeout=max(0.0, deadline - time.monotonic())):
        first = _component(ledger.record, sorted(pending)[0])
        raise _not_ready(first, _health(first), also=sorted(pending)[1:])


def _not_ready(
    component: ComponentRecord, health: Health, also: list[str] | None = None
) -> StartupError:
    reason = "exited" if health == "stopped" else "did not become ready in time"
    others = f" (nor did: {', '.join(also)})" if also else ""
    message = f"{component.name} {reason}{others}"
    if component.log is not None:
        message += f"\nlast lines of {component.log}:\n{log_tail(component.log)}"
    return StartupError(message)


def _stop(record: StackRecord, *, grace: float) -> None:
    # The supervisor first, so that it starts nothing again; it stops its services, and
    # whatever it left (or a supervisor that was dead left) is stopped from the record.
    supervisors = [c.process for c in record.of_kind("supervisor") if c.process is not None]
    stop_processes(supervisors, grace=grace * 2)
    current = read_record(record.data_dir) or record
    services = [c.process for c in current.of_kind("service") if c.process is not None]
    stop_processes(services, grace=grace, whole_group=True)
    for component in record.of_kind("postgres"):
        if component.process is not None:
            stop_postgres(
                pgdata=record.data_dir / PGDATA_DIR, process=component.process, grace=grace
            )
    nats = [c.process for c in record.of_kind("nats") if c.process is not None]
    stop_processes(nats, grace=grace)


def _evaluate(record: StackRecord) -> StackStatus:
    with ThreadPoolExecutor(max_workers=len(record.components) or 1) as pool:
        components = tuple(pool.map(_probe, record.components))
    return StackStatus(data_dir=record.data_dir, record=record, components=components)


def _health(component: ComponentRecord) -> Health:
    return _probe(component).health


def _probe(component: ComponentRecord) -> ComponentStatus:
    if component.process is not None and not is_running(component.process):
        return ComponentStatus(component, "stopped")
    about: Mapping[str, str] = {}
    match component.kind:
        case "nats":
            ok = nats_is_healthy(component.address)
        case "postgres":
            ok = postgres_is_healthy(component.address)
        case "supervisor":
            ok = component.process is not None
        case "service":
            readiness = (
                service_readiness(component.health_port)
                if component.health_port is not None
                else None
            )
            ok = readiness is not None and readiness.ready
            about = readiness.about if readiness is not None else {}
    return ComponentStatus(component, "healthy" if ok else "unhealthy", about)


def _component(record: StackRecord, name: str) -> ComponentRecord:
    return next(c for c in record.components if c.name == name)
