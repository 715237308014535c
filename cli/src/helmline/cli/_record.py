"""The stack record (`DATA/stack.json`): what a data folder's stack started, and where.

It is written atomically after every component that starts, so that `down` can stop a
half-started stack whose `up` was interrupted.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from helmline.cli._errors import CliError
from helmline.runtime import Durability

RECORD_FILE = "stack.json"
LOCK_FILE = "stack.lock"
RECORD_LOCK_FILE = "stack.json.lock"
LOGS_DIR = "logs"
NATS_STORE_DIR = "nats"
PGDATA_DIR = "postgres"

ComponentKind = Literal["nats", "postgres", "supervisor", "service"]


class ProcessRecord(BaseModel):
    """A process the stack started; `create_time` tells it apart from a later one with its pid."""

    model_config = ConfigDict(frozen=True)

    pid: int
    create_time: float
    argv: list[str]
    run_as: str | None = None


class ComponentRecord(BaseModel):
    """One part of the stack: an embedded or external server, or a service."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: ComponentKind
    address: str
    process: ProcessRecord | None = None
    health_port: int | None = None
    log: Path | None = None
    service: str | None = None
    """For a service's process, the service it runs (`name` tells its replicas apart)."""
    restarts: int = 0
    """How often the supervisor started the process again after it exited."""
    last_exit_code: int | None = None
    """How the process last exited (negative: killed by that signal); None while the
    first one runs, or when the exit was not seen (the supervisor did not start it)."""
    last_start: datetime | None = None
    """When the process now recorded was started."""


class StackRecord(BaseModel):
    """Everything one `helmline up` started from one data folder."""

    model_config = ConfigDict(frozen=True)

    version: Literal[1] = 1
    data_dir: Path
    started_at: datetime
    nats_url: str
    database_url: str
    api_url: str | None = None
    durability: Durability | None = None
    """Whether the embedded nats-server fsyncs before it acknowledges; None with an external
    NATS, whose own configuration decides."""
    components: tuple[ComponentRecord, ...] = ()
    complete: bool = False
    """Every component started and became ready; false while `up` is still at work."""
    options: dict[str, str] = {}
    """How `up` was asked to run the stack (ports as chosen, files, replicas), so that a
    later `up` can restart a part as it was and refuse options that differ."""

    def with_component(self, component: ComponentRecord) -> StackRecord:
        """The record with `component` in place of the one of its name, or added last."""
        names = [c.name for c in self.components]
        if component.name not in names:
            return self.model_copy(update={"components": (*self.components, component)})
        components = list(self.components)
        components[names.index(component.name)] = component
        return self.model_copy(update={"components": tuple(components)})

    def of_kind(self, kind: ComponentKind) -> tuple[ComponentRecord, ...]:
        return tuple(c for c in self.components if c.kind == kind)


def read_record(data_dir: Path) -> StackRecord | None:
    path = data_dir / RECORD_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return StackRecord.model_validate_json(raw)
    except ValidationError as error:
        raise CliError(
            f"{path} is not a stack record this version understands ({error.error_count()} "
            "problems); stop its processes by hand and remove it"
        ) from error


def write_record(record: StackRecord) -> None:
    # Readers (`status`, another `up`) must never see half a file: write aside, then rename.
    target = record.data_dir / RECORD_FILE
    descriptor, temporary = tempfile.mkstemp(prefix=".stack.", dir=record.data_dir)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(record.model_dump_json(indent=2))
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def update_record(data_dir: Path, change: Callable[[StackRecord], StackRecord]) -> StackRecord:
    """Read, change and write the record as one step: `up` and the supervisor both write
    it, and neither may lose what the other wrote meanwhile."""
    with _locked(data_dir / RECORD_LOCK_FILE):
        current = read_record(data_dir)
        if current is None:
            raise CliError(f"no stack record in {data_dir} to update")
        changed = change(current)
        write_record(changed)
        return changed


def remove_record(data_dir: Path) -> None:
    (data_dir / RECORD_FILE).unlink(missing_ok=True)


@contextmanager
def stack_lock(data_dir: Path) -> Iterator[None]:
    """Serialise `up` and `down` on one data folder; a second caller waits for the first."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir / LOCK_FILE):
        yield


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
