"""Handlers declared where they subscribe, held to the consumer that feeds them.

A service's handler class names its consumer and marks each method with the event types it
handles; calling the handler runs the method of the event's type (one dict lookup):

```
class PlannerHandler:
    router = Router(PLANNER_CONSUMER)

    @router.on(SessionStarted, PlanApproved)
    async def _plan(self, delivery: Delivery) -> None: ...

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)
```

The consumer's subjects stay declared in contracts: provisioning, the Helm chart, `helmline
up` and the AsyncAPI document read every consumer without importing a service. The router
keeps the two from drifting apart, both ways: marking a method for a type the consumer does
not receive fails on import, and consuming with a consumer that receives a type no method
handles fails before the first message is taken (`EventConsumer`). An event of a type with
no method (a newer producer's, reaching this service during an upgrade) raises
`NotHandled`, which every consumer settles the same way: acknowledged, skipped, counted in
`helmline_events_skipped_total`, logged once per type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from helmline.contracts import ConsumerSpec, Payload, received_payloads
from helmline.runtime._errors import NotHandled, RoutingError

if TYPE_CHECKING:
    from helmline.runtime._consumer import Delivery

Route = Callable[[Any, "Delivery"], Awaitable[None]]
"""A handler's method: it takes the handler and one delivery."""

R = TypeVar("R", bound=Route)


class Router:
    """Which method of a handler handles each event type its consumer receives."""

    def __init__(self, consumer: ConsumerSpec) -> None:
        self.consumer = consumer
        """The consumer whose events the handler handles."""
        self._received = frozenset(received_payloads(consumer))
        self._routes: dict[type[Payload], Route] = {}

    @property
    def handled(self) -> frozenset[type[Payload]]:
        """The event types a method handles."""
        return frozenset(self._routes)

    def on(self, *payloads: type[Payload]) -> Callable[[R], R]:
        """Mark a method as the handler of events of `payloads` (exactly these classes: a
        subclass, such as `PermissionRequested` of `ApprovalRequested`, is named too)."""
        if not payloads:
            raise RoutingError("a handler handles at least one event type")
        durable = self.consumer.durable
        foreign = [payload.TYPE for payload in payloads if payload not in self._received]
        if foreign:
            raise RoutingError(
                f"{durable} does not receive {', '.join(foreign)}: add the type to its "
                "consumer in helmline.contracts, or handle it in the service that receives it"
            )
        twice = [payload.TYPE for payload in payloads if payload in self._routes]
        if twice:
            raise RoutingError(f"{durable}: {', '.join(twice)} handled by two methods")

        def register(route: R) -> R:
            for payload in payloads:
                self._routes[payload] = route
            return route

        return register

    async def dispatch(self, owner: object, delivery: Delivery) -> None:
        """Run `owner`'s method for the delivered event's type; `NotHandled` if it has none."""
        route = self._routes.get(type(delivery.event.data))
        if route is None:
            raise NotHandled(delivery.event.type)
        await route(owner, delivery)

    def refuse_unhandled(self, consumer: ConsumerSpec) -> None:
        """Raise `RoutingError` if `consumer` receives a type no method handles."""
        unhandled = [p.TYPE for p in received_payloads(consumer) if p not in self._routes]
        if unhandled:
            raise RoutingError(
                f"{consumer.durable} receives {', '.join(unhandled)}, which no method of "
                f"{self.consumer.durable}'s handler handles"
            )


@runtime_checkable
class Routed(Protocol):
    """A handler whose router says which of its methods handles each event."""

    router: Router
