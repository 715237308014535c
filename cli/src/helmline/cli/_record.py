"""The stack record (`DATA/stack.json`): what a data folder's stack started, and where.

It is written atomically after every component that starts, so that `down` can stop a
half-started stack whose `up` was interrupted.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from helmline.cli._errors import CliError

RECORD_FILE = "stack.json"
LOCK_FILE = "stack.lock"
LOGS_DIR = "logs"
NATS_STORE_DIR = "nats"
PGDATA_DIR = "postgres"

ComponentKind = Literal["nats", "postgres", "service"]


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


class StackRecord(BaseModel):
    """Everything one `helmline up` started from one data folder."""

    model_config = ConfigDict(frozen=True)

    version: Literal[1] = 1
    data_dir: Path
    started_at: datetime
    nats_url: str
    database_url: str
    api_url: str | None = None
    components: tuple[ComponentRecord, ...] = ()
    complete: bool = False
    """Every component started and became ready; false while `up` is still at work."""

    def with_component(self, component: ComponentRecord) -> StackRecord:
        kept = tuple(c for c in self.components if c.name != component.name)
        return self.model_copy(update={"components": (*kept, component)})

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


def remove_record(data_dir: Path) -> None:
    (data_dir / RECORD_FILE).unlink(missing_ok=True)


@contextmanager
def stack_lock(data_dir: Path) -> Iterator[None]:
    """Serialise `up` and `down` on one data folder; a second caller waits for the first."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
