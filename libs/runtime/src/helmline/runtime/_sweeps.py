"""Sweeping what services keep beside the log (stored states, tool outputs, workspace
snapshots) for sessions whose events the stream's retention limits have all removed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

import nats.errors

from helmline.runtime._store import EventStore

logger = logging.getLogger(__name__)

Sweep = Callable[[], Awaitable[int]]
"""One sweep; returns how many things it removed."""


async def sessions_gone(
    store: EventStore, sessions: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Those of `sessions` (tenant, session id) of which the log holds no event any more.

    Only retention removes events, oldest first, so a session gone never comes back (but by
    `helmline import`, which brings back its events and not what was kept beside them)."""
    return {session for session in set(sessions) if await store.last_seq(*session) == 0}


async def sweep_every(interval_s: float, what: str, sweep: Sweep) -> None:
    """Run `sweep` now and then every `interval_s`, for as long as the service runs; NATS
    away for a while only puts a sweep off to the next."""
    while True:
        try:
            removed = await sweep()
        except (nats.errors.Error, TimeoutError) as error:
            logger.warning("could not sweep %s: %r", what, error)
        except Exception:
            # Whatever stopped this sweep (an object it cannot read), the service goes on
            # and so do later sweeps; a sweep stopped short removes less, never more.
            logger.exception("sweeping %s failed", what)
        else:
            if removed:
                logger.info("swept %d %s of sessions the log no longer holds", removed, what)
        await asyncio.sleep(interval_s)
