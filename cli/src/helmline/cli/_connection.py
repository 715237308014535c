"""The running stack's event log, as one command reaches it: find NATS, connect, disconnect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.js import JetStreamContext

from helmline.cli._errors import CliError
from helmline.cli._record import read_record
from helmline.cli._settings import CliSettings
from helmline.runtime import EventStore, connect_nats, nats_servers, without_credentials

CONNECT_TIMEOUT_S = 3
RETRY_AFTER_S = 1
"""Wait before a command's second and last try of each server (a restarting server, say)."""


def stack_nats_url(settings: CliSettings) -> str:
    """HELMLINE_NATS_URL if set, else the NATS that the data folder's stack runs on."""
    if settings.nats_url:
        return settings.nats_url
    data_dir = settings.resolved_data_dir()
    record = read_record(data_dir)
    if record is None:
        raise CliError(
            f"no stack is running from {data_dir}: start one with `helmline up` "
            "(or point at one with --data-dir or HELMLINE_NATS_URL)"
        )
    return record.nats_url


def stack_database_url(settings: CliSettings) -> str | None:
    """HELMLINE_DATABASE_URL if set, else the read model's PostgreSQL of the data folder's
    stack; None when neither is there."""
    if settings.database_url:
        return settings.database_url
    record = read_record(settings.resolved_data_dir())
    return record.database_url if record else None


@dataclass(frozen=True)
class EventLog:
    """A connection to the session event log."""

    nc: NATS
    js: JetStreamContext
    store: EventStore


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[EventLog]:
    """Connect to NATS at `url` for the duration of one command; fail fast if it is not there."""

    async def quiet(error: Exception) -> None:
        # nats-py logs every failed attempt by default; the one error raised below says it all.
        pass

    try:
        nc = await connect_nats(
            nats_servers(url),
            connect_timeout=CONNECT_TIMEOUT_S,
            allow_reconnect=False,
            # nats-py tries each server until it has failed more than this many times; 0
            # would mean forever, and a command must fail fast when NATS is not there.
            max_reconnect_attempts=1,
            reconnect_time_wait=RETRY_AFTER_S,
            error_cb=quiet,
        )
    except (OSError, TimeoutError, nats.errors.Error) as error:
        raise CliError(
            f"cannot reach NATS at {without_credentials(url)}: {error or type(error).__name__}"
        ) from error
    try:
        js = nc.jetstream()
        yield EventLog(nc=nc, js=js, store=EventStore(js))
    except NoRespondersError as error:
        raise CliError(
            f"NATS at {without_credentials(url)} has no Helmline event stream; "
            "`helmline up` provisions it"
        ) from error
    except (nats.errors.Error, TimeoutError) as error:
        raise CliError(
            f"the event log at {without_credentials(url)} did not answer: {error!r}"
        ) from error
    finally:
        await nc.close()
