"""Every service's handler handles exactly the event types its consumer receives: the
consumers declared in contracts (which provisioning, the Helm chart and the AsyncAPI document
read) and the handlers declared in the services cannot drift apart."""

from __future__ import annotations

import pytest

from helmline.approval._handlers import ApprovalHandler
from helmline.contracts import READ_MODEL_CONSUMER, SERVICE_CONSUMERS, received_payloads
from helmline.planner._handlers import PlannerHandler
from helmline.sandbox import SandboxHandler
from helmline.state._handlers import StateHandler
from helmline.tool_gateway._handlers import GatewayHandler

ROUTERS = {
    handler.__name__: handler.router
    for handler in (PlannerHandler, ApprovalHandler, GatewayHandler, SandboxHandler, StateHandler)
}


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_a_service_handles_exactly_what_its_consumer_receives(name: str) -> None:
    router = ROUTERS[name]
    received = {payload.TYPE for payload in received_payloads(router.consumer)}
    handled = {payload.TYPE for payload in router.handled}
    assert received, f"{router.consumer.durable} receives no event type"
    assert handled == received, (
        f"handled, not received: {sorted(handled - received)}; "
        f"received, not handled: {sorted(received - handled)}"
    )
    router.refuse_unhandled(router.consumer)


def test_every_consumer_but_the_projection_has_a_router() -> None:
    # The read model folds every event of every type through the session fold: it has no
    # handler per type to route to.
    routed = [router.consumer for router in ROUTERS.values()]
    assert sorted(spec.durable for spec in routed) == sorted(
        spec.durable for spec in SERVICE_CONSUMERS if spec != READ_MODEL_CONSUMER
    )
    assert all(spec in SERVICE_CONSUMERS for spec in routed)
