"""Webhooks: a receiver started by the test gets each approval request, signed, also after
it failed to answer the first time."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from helmline.approval._handlers import ApprovalHandler
from helmline.approval._policy_source import PolicySource
from helmline.approval._webhooks import WebhookNotifier, signature
from helmline.contracts import (
    ApprovalRequested,
    decode_event,
)
from helmline.runtime import Delivery, EventStore, FoldedStates
from helmline.runtime.testing import eventually, session_started

SECRET = "s3cret"


class Receiver:
    """An HTTP server that answers 500 to the first delivery of each event, then 200."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.failed_once: set[str] = set()
        receiver = self

        class Handle(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers.items()), body))
                event_id = self.headers["X-Helmline-Event-Id"]
                first = event_id not in receiver.failed_once
                receiver.failed_once.add(event_id)
                self.send_response(500 if first else 200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def accepted(self) -> list[tuple[dict[str, str], bytes]]:
        # Every delivery after the first of its event was answered 200.
        seen: set[str] = set()
        accepted = []
        for headers, body in self.received:
            event_id = headers["X-Helmline-Event-Id"]
            if event_id in seen:
                accepted.append((headers, body))
            seen.add(event_id)
        return accepted


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    thread = threading.Thread(target=running.server.serve_forever, daemon=True)
    thread.start()
    yield running
    running.server.shutdown()
    running.server.server_close()


async def test_each_request_is_announced_signed_and_retried_after_a_failure(
    receiver: Receiver, js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules: [{name: all, effect: allow}]\n"
        "webhooks:\n"
        f"  - {{tenant: '{tenant}', url: '{receiver.url}', secret: team}}\n"
        f"  - {{tenant: other, url: '{receiver.url}', secret: team}}\n"
    )
    notifier = WebhookNotifier({"team": SECRET}, retry_delays_s=(0.05, 0.05))
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy), notifier)
    requests = []
    try:
        for number in range(2):
            started = session_started(tenant)
            await store.append(started)
            asked = started.derive(
                ApprovalRequested(
                    request_id=f"r{number}",
                    scope="step",
                    risk="high",
                    reason="test",
                    expires_at=datetime.now(UTC) + timedelta(minutes=5),
                ),
                source="test",
            )
            appended = await store.append(asked)
            requests.append(asked)
            await handler(Delivery(asked, appended.seq, 1))

        await eventually(lambda: len(receiver.accepted()) == 2, what="two accepted deliveries")
    finally:
        await handler.close()

    assert len(receiver.received) == 4  # Each event: refused once, then accepted.
    # The two announcements run side by side, so they may arrive in either order.
    by_id = {
        headers["X-Helmline-Event-Id"]: (headers, body) for headers, body in receiver.accepted()
    }
    assert set(by_id) == {str(asked.id) for asked in requests}
    for asked in requests:
        headers, body = by_id[str(asked.id)]
        assert decode_event(body) == asked
        assert headers["X-Helmline-Event-Id"] == str(asked.id)
        assert abs(int(headers["X-Helmline-Timestamp"]) - time.time()) < 60
        expected = signature(SECRET, headers["X-Helmline-Timestamp"], body)
        assert hmac.compare_digest(headers["X-Helmline-Signature"], expected)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    assert signature("k", "1", b"{}") == ("sha256=" + hmac.new(b"k", b"1.{}", "sha256").hexdigest())
