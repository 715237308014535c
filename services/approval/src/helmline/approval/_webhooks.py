"""Webhooks: every new approval request announced to its tenant's receivers, signed, retried.

The body is the `approval.requested` CloudEvent as JSON. The receiver checks
`X-Helmline-Signature: sha256=<hex>`, the HMAC-SHA256 with the shared secret of
`<X-Helmline-Timestamp>.<body>`, and may refuse old timestamps (replays). A receiver
that does not answer 2xx is asked again with growing pauses (`X-Helmline-Event-Id` tells
repeats apart). Retries live in the process: an announcement still being retried when the
service stops is not resumed after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import hmac
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from helmline.approval._document import WebhookDocument
from helmline.contracts import Event, encode_event

logger = logging.getLogger(__name__)

RETRY_DELAYS_S = (0.5, 1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
"""Pauses between attempts; after the last, the announcement is given up (and logged)."""
TIMEOUT_S = 5.0


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Helmline-Signature` value of a body sent at `timestamp` (Unix seconds)."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


class WebhookNotifier:
    """Posts announcements in the background, so that deciding never waits on a receiver."""

    def __init__(
        self, secrets: Mapping[str, str], retry_delays_s: Sequence[float] = RETRY_DELAYS_S
    ) -> None:
        self._secrets = secrets
        self._retry_delays_s = retry_delays_s
        self._tasks: set[asyncio.Task[None]] = set()

    def announce(self, event: Event, webhooks: Sequence[WebhookDocument]) -> None:
        """Start announcing the event to each webhook of its tenant."""
        for webhook in webhooks:
            if not any(fnmatch.fnmatchcase(event.tenant, glob) for glob in webhook.tenant):
                continue
            secret = self._secrets.get(webhook.secret)
            if secret is None:
                logger.error(
                    "webhook %s: no secret %r in HELMLINE_WEBHOOK_SECRETS; not announced",
                    webhook.url,
                    webhook.secret,
                )
                continue
            task = asyncio.create_task(self._deliver(event, webhook.url, secret))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop announcing (pending ones are lost; see the module's note on restarts)."""
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _deliver(self, event: Event, url: str, secret: str) -> None:
        body = encode_event(event)
        for attempt, pause in enumerate((0.0, *self._retry_delays_s), start=1):
            await asyncio.sleep(pause)
            timestamp = str(int(time.time()))
            status = await asyncio.to_thread(_post, url, body, event, timestamp, secret)
            if 200 <= status < 300:
                return
            logger.warning("webhook %s answered %s (attempt %d)", url, status or "nothing", attempt)
        logger.error("webhook %s: gave up announcing %s", url, event.id)


def _post(url: str, body: bytes, event: Event, timestamp: str, secret: str) -> int:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/cloudevents+json",
            "X-Helmline-Event-Id": str(event.id),
            "X-Helmline-Timestamp": timestamp,
            "X-Helmline-Signature": signature(secret, timestamp, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0  # Unreachable or timed out: the same as an answer that is not 2xx.
