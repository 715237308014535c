"""Follow one tenant's tool calls from Helmline's event log, and resume after a restart.

Copy this file to start a subscriber of your own. It needs `nats-py` and
`helmline-contracts` (the typed events), nothing else of Helmline:

    python subscriber.py --nats-url nats://127.0.0.1:4222 --tenant acme --durable audit

It creates (or reuses) a durable pull consumer on the HELMLINE_EVENTS stream filtered to
`helmline.events.<tenant>.*.tool.call.*`, prints one JSON line per event and acknowledges
it only after handling it. Stop it and start it again with the same --durable name: it
carries on after the last event it acknowledged, with nothing skipped and nothing repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

import nats
from nats.errors import TimeoutError as FetchTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from helmline.contracts import EVENTS_STREAM, UndecodableEvent, decode_event, event_type_filter


def handle(seq: int, raw: bytes) -> None:
    """Your code goes here. This one prints a line per tool call event."""
    try:
        event = decode_event(raw)
    except UndecodableEvent as error:
        # A newer Helmline may add event types or versions this copy of the contracts does
        # not know yet: note it and move on rather than block the stream.
        print(json.dumps({"seq": seq, "undecodable": str(error)}), flush=True)
        return
    print(
        json.dumps(
            {
                "seq": seq,
                "type": event.type,
                "session": event.session_id,
                "call": getattr(event.data, "call_id", None),
                "tool": getattr(event.data, "tool", None),
            }
        ),
        flush=True,
    )


async def follow(
    nats_url: str, tenant: str, durable: str, types: str, stop_after: int | None
) -> None:
    connection = await nats.connect(nats_url, name=f"subscriber-{durable}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    subscription = await connection.jetstream().pull_subscribe(
        event_type_filter(types, tenant),
        durable=durable,
        stream=EVENTS_STREAM.name,
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=10,
            ack_wait=30,
        ),
    )
    handled = 0
    while not stop.is_set():
        try:
            messages = await subscription.fetch(batch=100, timeout=1)
        except FetchTimeout:
            continue  # Nothing new within a second: ask again (a long poll, not a busy loop).
        for message in messages:
            if stop.is_set():
                await message.nak()  # Not handled: hand it back now, not after ack_wait.
                continue
            handle(message.metadata.sequence.stream, message.data)
            await message.ack_sync()  # Acknowledged only once handled: at-least-once.
            handled += 1
            if stop_after is not None and handled >= stop_after:
                stop.set()
    await connection.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--durable", required=True, help="consumer name; reuse it to resume")
    parser.add_argument("--types", default="tool.call.*", help="event types, e.g. session.*")
    parser.add_argument("--stop-after", type=int, help="exit after this many events")
    arguments = parser.parse_args()
    asyncio.run(
        follow(
            arguments.nats_url,
            arguments.tenant,
            arguments.durable,
            arguments.types,
            arguments.stop_after,
        )
    )


if __name__ == "__main__":
    main()
