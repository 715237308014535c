"""The tool gateway's edge: authorised calls in; results, failures or sandbox requests out.

An MCP call is recorded as started before it is sent. A redelivered call (the gateway died,
or could not record the outcome) asks the session's folded state first (`LogStates`: no
scan of the log): a call with an outcome is done; one that was started but has no outcome
may or may not have reached the server, so it is sent again only if its tool is declared
idempotent, and otherwise failed as `unknown_outcome` for the planner and people to decide.

A call of a tool declared pure, which the session made before with the same arguments, is
not sent: it ends with the earlier call's result, read from the log (`_results`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import httpx2
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT
from pydantic import JsonValue
from pydantic_core import to_json

from helmline.contracts import (
    TOOL_GATEWAY_CONSUMER,
    Event,
    InverseCall,
    Risk,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    StepAuthorized,
    StepScheduled,
    ToolCallAttemptFailed,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolError,
    ToolSpec,
)
from helmline.runtime import (
    Appended,
    ArgumentChecker,
    Delivery,
    EventStore,
    FoldedStates,
    InjectionClassifier,
    LogStates,
    RetryableError,
    Router,
    SecretsError,
    SecretStore,
    classified,
    has_references,
    make_error_safe,
    make_safe,
    resolved_arguments,
)
from helmline.tool_gateway._calls import RunOnServer, failed, route
from helmline.tool_gateway._config import RateLimit
from helmline.tool_gateway._federation import SOURCE, Federation
from helmline.tool_gateway._forwarding import CallsTools, PoolFull
from helmline.tool_gateway._http import HttpRefusal, http_refusal
from helmline.tool_gateway._instances import Instances
from helmline.tool_gateway._mcp import McpServer, ServerUnavailable
from helmline.tool_gateway._plans import PlanApprovals
from helmline.tool_gateway._ratelimit import RateLimiter
from helmline.tool_gateway._raw_outputs import RawOutputs, raw_output_name
from helmline.tool_gateway._registry import rate_limit_of
from helmline.tool_gateway._resilience import LONGEST_PAUSE_S, CircuitChange, backoff_s
from helmline.tool_gateway._results import PureResults

logger = logging.getLogger(__name__)


class _Attempt(Exception):
    """One try failed. `definite`: the server refused it, so it did not take effect;
    `retry_in_s`: how long the server asked to wait before the next try, if it did."""

    def __init__(
        self,
        error: ToolError,
        *,
        definite: bool,
        counts_against_server: bool,
        retry_in_s: float | None = None,
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.definite = definite
        self.counts_against_server = counts_against_server
        self.retry_in_s = retry_in_s


class GatewayHandler:
    """Validates each authorised call and runs it: pure tools here, MCP tools on their
    server, built-in workspace tools by handing them to the sandbox."""

    router = Router(TOOL_GATEWAY_CONSUMER)

    def __init__(
        self,
        store: EventStore,
        federation: Federation,
        *,
        limiter: RateLimiter | None = None,
        results: PureResults | None = None,
        raw_outputs: RawOutputs | None = None,
        max_output_bytes: int = 65536,
        limits_by_risk: Mapping[Risk, RateLimit] | None = None,
        secrets: SecretStore | None = None,
        classifier: InjectionClassifier | None = None,
        states: FoldedStates | None = None,
        instances: Instances | None = None,
    ) -> None:
        """`secrets`: where the secrets that MCP calls refer to are resolved (without, a
        call that refers to one fails); `classifier`: asked about each MCP result after
        output safety's patterns, if configured; `states`: the sessions' stored states, a
        redelivered call's session is folded on from (without, from its whole log);
        `instances`: the servers' instances and pools (without, made here, their figures
        on no `/metrics`)."""
        self._store = store
        self._log_states = LogStates(store, states)
        self._classifier = classifier
        self._secrets = secrets
        self._federation = federation
        self._limiter = limiter
        self._results = results
        self._raw_outputs = raw_outputs
        self._max_output_bytes = max_output_bytes
        self._limits_by_risk = limits_by_risk or {}
        self._checker = ArgumentChecker()
        self._plans = PlanApprovals(store)
        self._instances = instances or Instances(
            store, federation.servers, source=SOURCE, gateway=federation.gateway
        )

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(ToolCallAuthorized)
    async def _on_authorized(self, delivery: Delivery) -> None:
        assert isinstance(delivery.event.data, ToolCallAuthorized)
        await self._run(delivery, delivery.event.data)

    @router.on(SessionCompleted, SessionFailed, SessionCancelled)
    async def _on_session_ended(self, delivery: Delivery) -> None:
        event = delivery.event
        await self._instances.session_ended(event.tenant, event.session_id)

    @router.on(StepAuthorized, StepScheduled)
    async def _on_scheduled(self, delivery: Delivery) -> None:
        """Run a step scheduled as its approved plan authorised it (`step.authorized`, or a
        `step.scheduled` naming the plan, as planners before `step.authorized` appended it;
        other steps are the approval service's to judge). A step that claims an
        authorisation its plan's approval does not hold is failed, not run (nor judged: the
        approval service leaves it here)."""
        event = delivery.event
        scheduled = event.data
        assert isinstance(scheduled, StepScheduled)
        if scheduled.authorized_by_plan is None:
            return
        authorized = await self._plans.authorized_call(event, scheduled)
        if authorized is None:
            refusal = ToolError(
                kind="permission",
                message=f"the call was scheduled as authorised by plan revision "
                f"{scheduled.authorized_by_plan}, whose approval does not authorise it",
                suggestion="report it: the planner and the approval disagree",
            )
            await self._record(event, _refused(scheduled, refusal))
            return
        await self._run(delivery, authorized)

    async def _run(self, delivery: Delivery, call: ToolCallAuthorized) -> None:
        """Validate an authorised call and run it where its tool runs."""
        if call.tool not in self._federation.tools:
            # A federated tool whose server is not connected (yet: the gateway may have just
            # started; or again: its process is being restarted) is unavailable for now, not
            # unknown.
            server = self._federation.server_of(call.tool)
            if server is not None and not await server.wait_connected(server.config.timeout_s):
                await self._record(delivery.event, failed(call, _not_connected(server)))
                return
        next_step = route(
            call,
            self._federation.tools,
            self._checker,
            arguments_bytes=len(to_json(call.arguments)),
        )
        if not isinstance(next_step, RunOnServer):
            # Same cause, same derived id: a redelivered call is stored once, never run twice
            # by the gateway; the sandbox checks the call's progress before running it again.
            await self._store.append(delivery.event.derive(next_step, source=SOURCE))
            return
        await self._run_on_server(delivery, call, next_step.tool)

    async def _run_on_server(
        self, delivery: Delivery, call: ToolCallAuthorized, tool: ToolSpec
    ) -> None:
        cause = delivery.event
        if delivery.maybe_handled:
            progress = (await self._log_states.now(delivery)).call_progress(call.call_id)
            if progress == "finished":
                return
            if progress == "started" and not tool.idempotent:
                await self._record(cause, failed(call, _UNKNOWN_OUTCOME))
                return
        held = self._federation.refusal(tool, call.definition_digest)
        if held is not None:
            await self._record(cause, failed(call, held))
            return
        # A secret's value may change under its reference: such a call is never answered
        # from an earlier one.
        reusable = tool.pure and not has_references(call.arguments)
        if reusable and self._results is not None:
            answer = await self._results.recall(cause, call)
            if answer is not None:
                # Answered from the log: the server is not asked, nor its rate limit counted.
                await self._record(cause, answer)
                return
        try:
            # Only here, where the call is sent; kept out of every event, log line and span.
            arguments = await resolved_arguments(self._secrets, cause.tenant, dict(call.arguments))
        except SecretsError as error:
            await self._record(cause, failed(call, error.tool_error()))
            return
        server = self._federation.servers[tool.server]
        limit = rate_limit_of(
            server.config,
            tool.remote_name or tool.name,
            call.risk,
            self._limits_by_risk,
            cause.tenant,
        )
        if limit is not None and self._limiter is not None:
            wait_s = await self._limiter.admit(cause.tenant, tool.name, limit)
            if wait_s is not None:
                logger.info("rate limit: call %s of %s refused", call.call_id, tool.name)
                await self._record(
                    cause,
                    failed(
                        call,
                        ToolError(
                            kind="rate_limited",
                            message=f"{tool.name} is limited to {limit.calls} calls per "
                            f"{limit.per_s:g} s for this tenant",
                            retryable=True,
                            suggestion=f"try again in {wait_s:.0f} s, or do without this tool",
                        ),
                        retry_in_s=wait_s,
                    ),
                )
                return
        try:
            async with self._instances.pools[tool.server].lease(
                cause.tenant, cause.session_id
            ) as instance:
                await self._send(cause, call, tool, server, instance, arguments, reusable=reusable)
        except PoolFull as full:
            logger.info("pool full: call %s of %s refused", call.call_id, tool.name)
            await self._record(cause, failed(call, full.error, retry_in_s=full.retry_in_s))

    async def _send(
        self,
        cause: Event,
        call: ToolCallAuthorized,
        tool: ToolSpec,
        server: McpServer,
        instance: CallsTools,
        arguments: dict[str, JsonValue],
        *,
        reusable: bool,
    ) -> None:
        """Send a call to the server's `instance` that serves it (its breaker is the
        server's), and record how it ended."""
        await self._record(
            cause,
            ToolCallStarted(
                call_id=call.call_id, step_id=call.step_id, tool=call.tool, server=tool.server
            ),
        )
        began = time.perf_counter()
        since = instance.egress_refused.mark()
        attempt = 1
        while True:
            try:
                result = await self._attempt(
                    server, instance, tool, call, arguments, key=str(cause.id)
                )
                break
            except _Attempt as failure:
                retry = (
                    attempt <= server.config.retries
                    and failure.error.retryable
                    and (failure.definite or tool.idempotent)
                    and (failure.retry_in_s or 0.0) <= LONGEST_PAUSE_S
                )
                if not retry:
                    reported = _as_reported(failure, tool)
                    ending = failed(
                        call,
                        reported,
                        attempts=attempt,
                        duration_ms=(time.perf_counter() - began) * 1000,
                        # When to try again means nothing for a call not to be retried.
                        retry_in_s=failure.retry_in_s if reported.retryable else None,
                    )
                    await self._record(
                        cause, await self._with_refusals(ending, instance, since, tool)
                    )
                    return
                pause = max(backoff_s(attempt), failure.retry_in_s or 0.0)
                await self._record(
                    cause,
                    ToolCallAttemptFailed(
                        call_id=call.call_id,
                        step_id=call.step_id,
                        tool=call.tool,
                        attempt=attempt,
                        # A server's message may quote the call (a secret's value among it).
                        error=make_error_safe(failure.error)[0],
                        retry_in_s=pause,
                    ),
                    key=f"attempt-{attempt}",
                )
                await asyncio.sleep(pause)
                attempt += 1
        duration_ms = (time.perf_counter() - began) * 1000
        outcome = await self._outcome(cause, call, tool, result, attempt, duration_ms)
        outcome = await self._with_refusals(outcome, instance, since, tool)
        appended = await self._record(cause, outcome)
        if reusable and isinstance(outcome, ToolCallCompleted) and self._results is not None:
            await self._results.remember(cause, call, appended.seq)

    async def _with_refusals(
        self,
        ending: ToolCallCompleted | ToolCallFailed,
        instance: CallsTools,
        since: int,
        tool: ToolSpec,
    ) -> ToolCallCompleted | ToolCallFailed:
        """The call's result naming the connections its instance's sandbox was refused
        while the call was in flight (see `EgressRefusals` for what that means on an
        instance serving calls at once)."""
        await instance.egress_refused.caught_up()
        refused = instance.egress_refused.since(since)
        if not refused:
            return ending
        self._instances.metrics.egress_refused.labels(tool.server, tool.name).inc(len(refused))
        return ending.model_copy(update={"egress_refused": refused})

    async def _attempt(
        self,
        server: McpServer,
        instance: CallsTools,
        tool: ToolSpec,
        call: ToolCallAuthorized,
        arguments: dict[str, JsonValue],
        *,
        key: str,
    ) -> CallToolResult:
        admitted, change = server.breaker.admit(time.monotonic())
        await self._breaker_moved(server, change)
        if not admitted:
            wait_s = max(0.0, server.breaker.retry_at() - time.monotonic())
            raise _Attempt(
                ToolError(
                    kind="unavailable",
                    message=f"MCP server {server.config.id} is failing: its circuit is open, "
                    "calls are not sent",
                    retryable=True,
                    suggestion=f"try again in {wait_s:.0f} s, or use another tool",
                ),
                definite=True,
                counts_against_server=False,
            )
        try:
            result = await instance.call(
                tool.remote_name or tool.name,
                arguments,
                timeout_s=tool.timeout_s,
                key=key,
            )
        except _SERVER_FAILURES as error:
            failure = _classify(server, tool, error)
            if failure.counts_against_server:
                change = server.breaker.failed(time.monotonic(), failure.error.message)
                await self._breaker_moved(server, change)
            raise failure from error
        await self._breaker_moved(server, server.breaker.succeeded())
        return result

    async def _breaker_moved(self, server: McpServer, change: CircuitChange | None) -> None:
        server.sync_breaker()
        if change is not None:
            await self._federation.circuit_changed(server, change)

    async def _outcome(
        self,
        cause: Event,
        call: ToolCallAuthorized,
        tool: ToolSpec,
        result: CallToolResult,
        attempts: int,
        duration_ms: float,
    ) -> ToolCallCompleted | ToolCallFailed:
        raw = _output_of(result)
        if result.is_error:
            # `failed` makes the message safe.
            text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
            return failed(
                call,
                ToolError(
                    kind="execution",
                    message=f"{call.tool} reported an error: {text}",
                    suggestion="read the message; change the arguments or use another tool",
                ),
                attempts=attempts,
                duration_ms=duration_ms,
            )
        safe = await classified(make_safe(raw, max_bytes=self._max_output_bytes), self._classifier)
        raw_name = None
        if safe.changed and self._raw_outputs is not None:
            raw_name = raw_output_name(cause.tenant, cause.session_id, call.call_id)
            await self._raw_outputs.keep(raw_name, raw)
        return ToolCallCompleted(
            call_id=call.call_id,
            step_id=call.step_id,
            tool=call.tool,
            output=safe.output,
            duration_ms=duration_ms,
            truncated=safe.truncated,
            redactions=safe.redactions,
            injection_suspected=safe.injection_suspected,
            neutralised=safe.neutralised,
            redacted_by=dict(safe.redacted_by),
            neutralised_by=dict(safe.suspected_by),
            raw_output=raw_name,
            attempts=attempts,
            inverse=_inverse_of(tool, call, raw),
            untrusted=tool.trust == "untrusted",
            classifier=safe.classifier,
        )

    async def _record(self, cause: Event, data: Any, *, key: str = "") -> Appended:
        try:
            return await self._store.append(cause.derive(data, source=SOURCE, key=key))
        except Exception as error:
            raise RetryableError(f"could not record {data.TYPE} of {cause.id}") from error


def _refused(scheduled: StepScheduled, error: ToolError) -> ToolCallFailed:
    return ToolCallFailed(
        call_id=scheduled.call_id, step_id=scheduled.step_id, tool=scheduled.tool, error=error
    )


_UNKNOWN_OUTCOME = ToolError(
    kind="unknown_outcome",
    message="the gateway stopped while the call was in flight; it may or may not have taken "
    "effect, and the tool is not declared idempotent, so it was not sent again",
    suggestion="check the target for the call's effect before calling it again",
)

_SERVER_FAILURES = (
    TimeoutError,
    ServerUnavailable,
    MCPError,
    httpx2.HTTPError,
    OSError,
)


def _classify(server: McpServer, tool: ToolSpec, error: BaseException) -> _Attempt:
    name = server.config.id
    match error:
        case TimeoutError():
            return _Attempt(
                ToolError(
                    kind="timeout",
                    message=f"{tool.name} did not answer within {tool.timeout_s:g} s",
                    retryable=True,
                    suggestion="try again later, with less work per call, or another tool",
                ),
                definite=False,
                counts_against_server=True,
            )
        case ServerUnavailable():
            return _Attempt(
                ToolError(
                    kind="unavailable",
                    message=f"MCP server {name} is unavailable: {error}",
                    retryable=True,
                    suggestion="try again later; the gateway reconnects in the background",
                ),
                # Not connected: nothing was sent. Connection lost mid-call: unknown.
                definite=not error.sent,
                counts_against_server=True,
            )
        case MCPError() if (refusal := http_refusal(error.error.data)) is not None:
            return _refused_over_http(name, refusal)
        case MCPError() if error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
            return _Attempt(
                ToolError(
                    kind="unavailable",
                    message=f"MCP server {name}: {error.error.message}",
                    retryable=True,
                    suggestion="try again later",
                ),
                definite=False,
                counts_against_server=True,
            )
        case MCPError() if error.code == INTERNAL_ERROR or -32099 <= error.code <= -32002:
            return _Attempt(
                ToolError(
                    kind="unavailable",
                    message=f"MCP server {name} failed the call: {error.error.message}",
                    retryable=True,
                    suggestion="try again later",
                ),
                definite=True,
                counts_against_server=True,
            )
        case MCPError():
            return _Attempt(
                ToolError(
                    kind="validation" if error.code == -32602 else "execution",
                    message=f"MCP server {name} refused the call: {error.error.message}",
                    suggestion="check the tool's name and arguments against its schema",
                ),
                definite=True,
                counts_against_server=False,
            )
        case _:
            return _Attempt(
                ToolError(
                    kind="unavailable",
                    message=f"MCP server {name}: {type(error).__name__}: {error}",
                    retryable=True,
                    suggestion="try again later",
                ),
                definite=False,
                counts_against_server=True,
            )


def _as_reported(failure: _Attempt, tool: ToolSpec) -> ToolError:
    """The error a failed call ends with. One that may have taken effect, of a tool not
    declared idempotent, is not retryable: the planner would otherwise send it again as a
    new attempt, and it might take effect twice."""
    if failure.definite or tool.idempotent:
        return failure.error
    return ToolError(
        kind="unknown_outcome",
        message=f"{failure.error.message}; the call may have taken effect, and the tool is "
        "not declared idempotent, so it was not sent again",
        suggestion=_UNKNOWN_OUTCOME.suggestion,
    )


def _not_connected(server: McpServer) -> ToolError:
    if server.credentials_refused is not None:
        return _refused_over_http(server.config.id, server.credentials_refused).error
    return ToolError(
        kind="unavailable",
        message=f"MCP server {server.config.id} is not connected: {server.view.error}",
        retryable=True,
        suggestion="try again later; the gateway reconnects in the background",
    )


def _refused_over_http(name: str, refusal: HttpRefusal) -> _Attempt:
    if refusal.status in (401, 403):
        status = HTTPStatus(refusal.status)
        return _Attempt(
            ToolError(
                kind="permission",
                message=f"MCP server {name} answered {status.value} {status.phrase}: it "
                "refused the gateway's credentials, so the call did not run",
                suggestion=f"check the credentials the gateway sends to {name} (the headers "
                "in its MCP servers file); trying again will not help until they change",
            ),
            definite=True,
            counts_against_server=False,
        )
    if refusal.status == 429:
        return _Attempt(
            ToolError(
                kind="rate_limited",
                message=f"MCP server {name} answered 429 Too Many Requests",
                retryable=True,
                suggestion="try again later, or call this tool less often",
            ),
            definite=True,
            counts_against_server=False,
            retry_in_s=refusal.retry_after_s,
        )
    # A 503 was not handled. A 502 or 504 comes from a proxy, which may have passed the call
    # on before the server failed or it stopped waiting: the call may have taken effect.
    return _Attempt(
        ToolError(
            kind="unavailable",
            message=f"MCP server {name} answered HTTP {refusal.status}",
            retryable=True,
            suggestion="try again later",
        ),
        definite=refusal.status == 503,
        counts_against_server=True,
        retry_in_s=refusal.retry_after_s,
    )


def _inverse_of(tool: ToolSpec, call: ToolCallAuthorized, result: JsonValue) -> InverseCall | None:
    """The call that undoes this one, from the full result (before any redaction)."""
    if tool.inverse is None:
        return None
    try:
        arguments = tool.inverse.resolve(call.arguments, result)
    except LookupError as error:
        logger.warning("no inverse for call %s of %s: %s", call.call_id, tool.name, error)
        return None
    return InverseCall(tool=tool.inverse.tool, arguments=arguments)


def _output_of(result: CallToolResult) -> JsonValue:
    """An MCP result as the log keeps it: its structured content when it has some, else its
    text, with other content blocks described rather than inlined."""
    if result.structured_content is not None:
        structured: JsonValue = result.structured_content
        return structured
    parts: list[JsonValue] = []
    for block in result.content:
        if block.type == "text":
            parts.append(block.text)
        else:
            parts.append({"type": block.type, "omitted": True})
    if all(isinstance(part, str) for part in parts):
        return "\n".join(str(part) for part in parts)
    return parts
