"""A tap on the deciding services' consumers for the chaos suite, in a process of its own so
that what it notes is timed by a loop with nothing else to do:
`python delivery_tap.py NATS_URL FILE`.

A plain subscription on a consumer's deliver subject gets a copy of each message handed to
the replicas' queue group (a consumer with a deliver group hands nothing to it alone, so
the tap changes no delivery), and one on the consumer's ack subjects hears each answer a
replica sends: an ack (empty or `+ACK`), `-NAK`, `+TERM` or an in-progress `+WPI`. Each
becomes one JSON line: `["delivered", at, reply, consumer, stream seq, delivery count]` or
`["answered", at, reply, answer]`, `at` in epoch seconds; `["listening"]` comes first.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import IO

from nats.aio.msg import Msg

from helmline.contracts import SERVICE_CONSUMERS, deliver_subject
from helmline.runtime import connect_nats, nats_servers


async def main(url: str, file: Path) -> None:
    with file.open("a", buffering=1) as out:
        nc = await connect_nats(
            nats_servers(url), max_reconnect_attempts=-1, reconnect_time_wait=0.1
        )

        async def delivered(message: Msg) -> None:
            metadata = message.metadata
            _note(out, "delivered", message.reply, metadata.consumer,
                  metadata.sequence.stream, metadata.num_delivered)  # fmt: skip

        async def answered(message: Msg) -> None:
            _note(out, "answered", message.subject, message.data.decode(errors="replace"))

        for spec in SERVICE_CONSUMERS:
            if spec.decides:
                await nc.subscribe(deliver_subject(spec.durable), cb=delivered)
                await nc.subscribe(f"$JS.ACK.{spec.stream}.{spec.durable}.>", cb=answered)
        await nc.flush()
        out.write(json.dumps(["listening"]) + "\n")
        await asyncio.Event().wait()  # Until terminated.


def _note(out: IO[str], kind: str, *what: object) -> None:
    out.write(json.dumps([kind, time.time(), *what]) + "\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
