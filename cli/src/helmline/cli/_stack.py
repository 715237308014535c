"""`up`, `down` and `status` for the stack of one data folder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from helmline.cli._catalogue import ServiceName
from helmline.cli._errors import CliError, StartupError
from helmline.cli._nats import ADMIN, NatsUsers, nats_is_healthy, start_nats
from helmline.cli._postgres import postgres_is_healthy, start_postgres, stop_postgres
from helmline.cli._processes import (
    is_running,
    log_tail,
    reserve_ports,
    stop_processes,
    wait_until,
)
from helmline.cli._record import (
    LOGS_DIR,
    NATS_STORE_DIR,
    PGDATA_DIR,
    ComponentRecord,
    StackRecord,
    read_record,
    remove_record,
    stack_lock,
    write_record,
)
from helmline.cli._services import service_is_ready, start_service
from helmline.cli._settings import CliSettings

Health = Literal["healthy", "unhealthy", "stopped"]

NATS = "nats"
POSTGRES = "postgres"


class StartupObserver(Protocol):
    """Told about each step of `up` as it happens (the terminal shows progress with it)."""

    def begin(self, step: str, detail: str = "") -> None: ...

    def done(self, step: str, detail: str = "") -> None: ...

    def note(self, message: str) -> None: ...


@dataclass(frozen=True)
class ComponentStatus:
    component: ComponentRecord
    health: Health


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
    """Start the data folder's stack, or report the one already running there."""
    began = time.monotonic()
    data_dir = settings.resolved_data_dir()
    with stack_lock(data_dir):
        existing = read_record(data_dir)
        if existing is not None:
            status = _evaluate(existing)
            if status.healthy:
                return UpResult(status, already_running=True, seconds=time.monotonic() - began)
            # An incomplete record is an `up` that was interrupted: this one holds the lock.
            if existing.complete and not _any_process_stopped(status):
                unhealthy = ", ".join(
                    c.component.name for c in status.components if c.health != "healthy"
                )
                raise CliError(
                    f"the stack in {data_dir} is running but not healthy ({unhealthy}); "
                    f"see {data_dir / LOGS_DIR}, or run `helmline down` and try again"
                )
            observer.note(f"cleaning up a stale stack in {data_dir}")
            _stop(existing, grace=settings.stop_grace)
            remove_record(data_dir)
        record = _start(
            settings, data_dir, environ, observer, deadline=began + settings.startup_timeout
        )
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
    interrupted `up` leaves behind what `down` needs to stop its processes."""

    def __init__(self, record: StackRecord) -> None:
        self.record = record
        write_record(record)

    def add(self, component: ComponentRecord, **updates: object) -> None:
        self.record = self.record.with_component(component).model_copy(update=updates)
        write_record(self.record)


@dataclass(frozen=True)
class _Ports:
    nats: int | None
    """None when an external NATS is used; likewise for PostgreSQL."""
    postgres: int | None
    api: int
    health: Mapping[ServiceName, int]


def _choose_ports(settings: CliSettings) -> _Ports:
    # One reservation for all, so no two components are handed the same free port.
    free = iter(reserve_ports(3 + len(ServiceName)))

    def pick(given: int | None) -> int:
        return given if given is not None else next(free)

    return _Ports(
        nats=pick(settings.nats_port) if settings.nats_url is None else None,
        postgres=pick(settings.pg_port) if settings.database_url is None else None,
        api=pick(settings.api_port),
        health={service: next(free) for service in ServiceName},
    )


def _start(
    settings: CliSettings,
    data_dir: Path,
    environ: Mapping[str, str],
    observer: StartupObserver,
    *,
    deadline: float,
) -> StackRecord:
    logs = data_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    ports = _choose_ports(settings)
    users = NatsUsers.generate() if ports.nats is not None else None
    ledger = _Ledger(
        StackRecord(
            data_dir=data_dir,
            started_at=datetime.now(UTC),
            nats_url=_nats_url(settings, ports, users, ADMIN),
            database_url=settings.database_url or "",
            api_url=f"http://127.0.0.1:{ports.api}",
        )
    )
    try:
        _start_servers(settings, ledger, ports, users, environ, observer, deadline=deadline)
        _provision(ledger.record.nats_url, observer, deadline=deadline)
        env = {
            **environ,
            "HELMLINE_DATABASE_URL": ledger.record.database_url,
            "HELMLINE_DATA_DIR": str(data_dir),
        }
        for service in ServiceName:
            observer.begin(service.value, "starting")
            api = {"HELMLINE_API_PORT": str(ports.api)} if service is ServiceName.API else {}
            own = {"HELMLINE_NATS_URL": _nats_url(settings, ports, users, service.value)}
            ledger.add(
                start_service(
                    service,
                    health_port=ports.health[service],
                    log=logs / f"{service.value}.log",
                    env={**env, **api, **own},
                    cwd=data_dir,
                    address=ledger.record.api_url if service is ServiceName.API else None,
                )
            )
        _wait_for_services(ledger.record, observer, deadline=deadline)
        ledger.record = ledger.record.model_copy(update={"complete": True})
        write_record(ledger.record)
    except BaseException:
        # A half-started stack is worse than none: stop what did start, keep the logs.
        _stop(ledger.record, grace=settings.stop_grace)
        remove_record(data_dir)
        raise
    return ledger.record


def _nats_url(settings: CliSettings, ports: _Ports, users: NatsUsers | None, user: str) -> str:
    """Where `user` (admin or a service) connects: to the embedded server as itself, or to the
    external NATS with the credentials its URL holds."""
    if settings.nats_url is not None:
        return settings.nats_url
    assert ports.nats is not None
    assert users is not None
    return users.url(ports.nats, user)


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
    if ports.nats is not None and users is not None:
        observer.begin(NATS, "starting")
        process = start_nats(
            store_dir=data_dir / NATS_STORE_DIR,
            port=ports.nats,
            users=users,
            log=logs / "nats.log",
            env=environ,
            cwd=data_dir,
        )
        ledger.add(
            ComponentRecord(
                name=NATS,
                kind="nats",
                address=f"nats://127.0.0.1:{ports.nats}",
                process=process,
                log=logs / "nats.log",
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

    for name in (POSTGRES, NATS):
        component = _component(ledger.record, name)
        _wait_for(component, deadline=deadline)
        observer.done(name, component.address)


def _provision(nats_url: str, observer: StartupObserver, *, deadline: float) -> None:
    # Imported here: the runtime pulls in the NATS client, which only this step needs.
    from helmline.runtime import provision

    observer.begin("streams", "provisioning")
    timeout = max(1.0, deadline - time.monotonic())
    try:
        asyncio.run(asyncio.wait_for(provision(nats_url), timeout=timeout))
    except TimeoutError as error:
        raise StartupError(
            f"provisioning JetStream at {nats_url} took over {timeout:.0f} s"
        ) from error
    except Exception as error:
        # Whatever the runtime raises, the person needs the server and the reason, not a
        # traceback through asyncio.
        raise StartupError(f"could not provision JetStream at {nats_url}: {error!r}") from error
    observer.done("streams", "provisioned")


def _wait_for(component: ComponentRecord, *, deadline: float) -> None:
    if component.process is None:
        # An external server is either there or not; it is not starting up.
        if _health(component) != "healthy":
            raise StartupError(
                f"{component.name} at {component.address} does not answer"
                + (" with JetStream enabled" if component.kind == "nats" else "")
            )
        return

    wait_until(
        lambda: _health(component) != "unhealthy", timeout=max(0.0, deadline - time.monotonic())
    )
    health = _health(component)
    if health != "healthy":
        raise _not_ready(component, health)


def _wait_for_services(record: StackRecord, observer: StartupObserver, *, deadline: float) -> None:
    pending = {c.name: c for c in record.of_kind("service")}

    def progressed() -> bool:
        for name, component in list(pending.items()):
            health = _health(component)
            if health == "healthy":
                observer.done(name, component.address)
                del pending[name]
            elif health == "stopped":
                raise _not_ready(component, health)
        return not pending

    if not wait_until(progressed, timeout=max(0.0, deadline - time.monotonic())):
        first = next(iter(pending.values()))
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
    services = [c.process for c in record.of_kind("service") if c.process is not None]
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
        healths = list(pool.map(_health, record.components))
    return StackStatus(
        data_dir=record.data_dir,
        record=record,
        components=tuple(
            ComponentStatus(component, health)
            for component, health in zip(record.components, healths, strict=True)
        ),
    )


def _health(component: ComponentRecord) -> Health:
    if component.process is not None and not is_running(component.process):
        return "stopped"
    match component.kind:
        case "nats":
            ok = nats_is_healthy(component.address)
        case "postgres":
            ok = postgres_is_healthy(component.address)
        case "service":
            ok = component.health_port is not None and service_is_ready(component.health_port)
    return "healthy" if ok else "unhealthy"


def _any_process_stopped(status: StackStatus) -> bool:
    return any(c.health == "stopped" for c in status.components)


def _component(record: StackRecord, name: str) -> ComponentRecord:
    return next(c for c in record.components if c.name == name)
