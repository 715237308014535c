"""`helmline dlq`: list, show, retry and discard dead letters against a real JetStream."""

from __future__ import annotations

import json

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from helmline.cli.testing import invoke
from helmline.contracts import EVENTS_STREAM, ConsumerSpec, event_subject, tenant_filter
from helmline.runtime import DeadLetterBox, Delivery, EventConsumer
from helmline.runtime.testing import eventually


async def _ignore(delivery: Delivery) -> None:
    del delivery


async def test_list_show_retry_and_discard(
    nats_url: str, nc: NATS, js: JetStreamContext, tenant: str
) -> None:
    spec = ConsumerSpec(
        durable=f"dlq-cli-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(tenant_filter(tenant),),
        description="test",
    )
    consumer = EventConsumer(nc, js, spec, _ignore)
    await consumer.start()
    await js.publish(event_subject(tenant, "s1", "session.started"), b"{broken")
    box = DeadLetterBox(nc, js)
    (parked,) = await eventually(lambda: box.letters(spec.durable), what="the letter parked")

    listed = await invoke(nats_url, "dlq", "list", "--consumer", spec.durable, "--json")
    assert listed.exit_code == 0, listed.output
    (letter,) = json.loads(listed.stdout)
    assert letter["seq"] == parked.seq
    assert "not valid JSON" in letter["reason"]
    shown = await invoke(nats_url, "dlq", "show", str(parked.seq))
    assert json.loads(shown.stdout)["payload"] == "{broken"

    retried = await invoke(nats_url, "dlq", "retry", str(parked.seq))
    assert retried.exit_code == 1
    assert "failed again" in retried.stderr
    as_json = await invoke(nats_url, "dlq", "retry", str(parked.seq), "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["handled"] is False
    await consumer.stop(grace_s=1)
    unanswered = await invoke(nats_url, "dlq", "retry", str(parked.seq))
    assert "no replica of" in unanswered.stderr

    discarded = await invoke(nats_url, "dlq", "discard", str(parked.seq), "--json")
    assert discarded.exit_code == 0, discarded.output
    assert json.loads(discarded.stdout) == {"seq": parked.seq, "discarded": True}
    missing = await invoke(nats_url, "dlq", "show", str(parked.seq))
    assert f"no dead letter {parked.seq}" in missing.stderr
