"""Riding out a JetStream cluster's elections.

A cluster that loses the server leading a stream (or the cluster's own placement leader)
elects another within seconds; meanwhile what needs a leader answers nothing, "no
responders" or "unavailable". Appends, leader-only reads and consumer creation ask again
until one is elected, rather than fail a decision or a person's command for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

T = TypeVar("T")

LEADERLESS_WAIT_S = 15.0
"""How long a request waits for a leader (an election takes about 6 s here after the
leading server of a three-server cluster is killed)."""
_FIRST_PAUSE_S = 0.05
_MAX_PAUSE_S = 0.5
_LEADERLESS = (NoStreamResponseError, ServiceUnavailableError, NatsTimeoutError, NoRespondersError)
"""What a request needing a leader meets while there is none."""


async def through_elections(ask: Callable[[], Awaitable[T]]) -> T:
    """`ask()`, asked again while the cluster has no leader for it, up to
    `LEADERLESS_WAIT_S`. Only for requests that are safe to repeat: reads, consumer
    creation, and appends carrying a message id (JetStream stores those once)."""
    deadline = asyncio.get_running_loop().time() + LEADERLESS_WAIT_S
    pause = _FIRST_PAUSE_S
    while True:
        try:
            return await ask()
        except _LEADERLESS:
            if asyncio.get_running_loop().time() + pause > deadline:
                raise
            # Nothing to wait on: the election is the servers', and says nothing meanwhile.
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)
