"""Shadow replay: run a recorded goal session again through today's planner, without effects.

The shadow session is new and lives in memory only. Its model calls are answered from the
recording and its tool calls from the recorded results, plans are approved or rejected as
they were, and nothing is appended to the log or run anywhere. Where the planner now asks the
model something else, or schedules another call, or ends differently, the replay stops and
names the first divergence: the way to check a prompt or code change against real sessions.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from helmline.contracts import (
    Event,
    ModelExchangeRecorded,
    ModelRequestRecord,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolSpec,
    fold,
    new_event,
)
from helmline.planner._engine import GoalEngine
from helmline.planner._goal import session_marker
from helmline.planner._providers import ModelCall, ModelError
from helmline.planner._settings import PlannerSettings
from helmline.planner._spotlight import new_marker

SOURCE = "helmline/shadow"
PLANNER_INPUTS = (
    SessionStarted,
    PlanApproved,
    PlanRejected,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallDenied,
)
"""What the planner reacts to in a goal session (controls from people are not replayed)."""
OUTCOMES = (ToolCallCompleted, ToolCallFailed, ToolCallDenied)


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where the shadow first behaved differently from the recorded session."""

    where: str
    """The model call or step, in words."""
    step: str | None
    """The step the divergent decision was about, when there is one."""
    recorded: str
    """What the recorded session did."""
    shadow: str
    """What the planner does now."""


@dataclass(slots=True)
class ShadowReport:
    """The outcome of a shadow replay."""

    session_id: str
    shadow_session_id: str
    model_calls: int = 0
    """Model calls the shadow made (all answered from the recording)."""
    steps: int = 0
    """Steps the shadow scheduled (all answered from recorded results)."""
    side_effects: int = 0
    """Tools run and events appended to the log: none, by construction."""
    recorded_status: str = ""
    shadow_status: str = ""
    divergences: list[Divergence] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Diverged(ModelError):
    """The shadow asked the model something the recording does not hold."""


class RecordedModel:
    """Answers the shadow's model calls from the recorded exchanges, in order."""

    provider = "recording"

    def __init__(self, recording: Sequence[Event], report: ShadowReport) -> None:
        self._exchanges = [e for e in recording if isinstance(e.data, ModelExchangeRecorded)]
        self._recording = recording
        self._report = report

    async def complete(self, request: ModelRequestRecord, tools: Sequence[ToolSpec]) -> ModelCall:
        turn = self._report.model_calls
        self._report.model_calls += 1
        if turn >= len(self._exchanges):
            self._diverge(
                f"model call {turn + 1}", None, "the session ended", "the planner asks the model"
            )
        event = self._exchanges[turn]
        recorded = event.data
        assert isinstance(recorded, ModelExchangeRecorded)
        difference = _request_difference(recorded.request, request)
        if difference is not None:
            step = _step_decided_by(self._recording, event)
            self._diverge(f"model call {turn + 1}", step, *difference)
        return ModelCall(
            reply=recorded.reply, attempts=recorded.attempts, duration_ms=recorded.duration_ms
        )

    def _diverge(self, where: str, step: str | None, recorded: str, shadow: str) -> None:
        self._report.divergences.append(Divergence(where, step, recorded, shadow))
        raise _Diverged(f"{where} diverged")


def _request_difference(
    recorded: ModelRequestRecord, shadow: ModelRequestRecord
) -> tuple[str, str] | None:
    """The first difference that the planner's behaviour makes (the model's name and the
    reply size are configuration, not behaviour)."""
    if recorded.system != shadow.system:
        return f"system prompt {recorded.system[:200]!r}", f"system prompt {shadow.system[:200]!r}"
    if recorded.tools != shadow.tools:
        return f"tools offered {list(recorded.tools)}", f"tools offered {list(shadow.tools)}"
    for index, (old, new) in enumerate(zip(recorded.messages, shadow.messages, strict=False)):
        if old != new:
            return (
                f"message {index + 1} ({old.role}): {old.content[:300]!r}",
                f"message {index + 1} ({new.role}): {new.content[:300]!r}",
            )
    if len(recorded.messages) != len(shadow.messages):
        return f"{len(recorded.messages)} messages", f"{len(shadow.messages)} messages"
    return None


def _step_decided_by(recording: Sequence[Event], exchange: Event) -> str | None:
    """The first step that a recorded model call decided on, if it decided one."""
    for event in recording:
        if event.causation_id == exchange.id and isinstance(event.data, PlanProposed):
            return event.data.steps[0].id if event.data.steps else None
    return None


async def shadow_replay(
    recording: Sequence[Event], settings: PlannerSettings, registry: Sequence[ToolSpec]
) -> ShadowReport:
    """Replay a recorded goal session in a new in-memory shadow session and report."""
    if not recording or not isinstance(recording[0].data, SessionStarted):
        raise ValueError("a recorded session starts with session.started")
    original = recording[0]
    shadow_id = f"shadow-{uuid.uuid4().hex[:24]}"
    report = ShadowReport(
        session_id=original.session_id,
        shadow_session_id=shadow_id,
        recorded_status=fold(recording).status,
    )
    # The recorded session's spotlighting marker, so the shadow's requests delimit tool
    # results alike; a session recorded before spotlighting has none, and its replay names
    # the new system prompt as the first divergence, which it is.
    recorded_marker = session_marker(recording)
    engine = GoalEngine(
        settings,
        RecordedModel(recording, report),
        lambda: registry,
        source="helmline/planner",
        marker=new_marker if recorded_marker is None else lambda: recorded_marker,
    )
    started = new_event(original.data, tenant=original.tenant, session_id=shadow_id, source=SOURCE)
    log: list[Event] = [started]
    queue: deque[Event] = deque([started])

    async def append(event: Event) -> None:
        queue.append(event)

    while queue and not report.divergences:
        event = queue.popleft()
        if isinstance(event.data, PLANNER_INPUTS):
            await engine.handle(event, log, append)
        for answer in _recorded_answers(recording, event, report):
            log.append(answer)
            queue.append(answer)
    report.shadow_status = fold(log).status
    if not report.divergences and report.shadow_status != report.recorded_status:
        report.divergences.append(
            Divergence(
                "the end", None, f"ended {report.recorded_status}", f"ends {report.shadow_status}"
            )
        )
    return report


def _recorded_answers(
    recording: Sequence[Event], event: Event, report: ShadowReport
) -> list[Event]:
    """What policy and the tools answered, in the recording, to what the shadow did."""
    data = event.data
    if isinstance(data, PlanProposed):
        return [
            event.derive(e.data, source=SOURCE)
            for e in recording
            if isinstance(e.data, PlanApproved | PlanRejected) and e.data.revision == data.revision
        ][:1]
    if not isinstance(data, StepScheduled):
        return []
    report.steps += 1
    scheduled = next(
        (
            e.data
            for e in recording
            if isinstance(e.data, StepScheduled) and e.data.call_id == data.call_id
        ),
        None,
    )
    shadow = f"{data.tool} {data.arguments}"
    if scheduled is None or (scheduled.tool, scheduled.arguments) != (data.tool, data.arguments):
        recorded = (
            "no such call" if scheduled is None else f"{scheduled.tool} {scheduled.arguments}"
        )
        report.divergences.append(
            Divergence(f"step {data.step_id}", data.step_id, recorded, shadow)
        )
        return []
    outcome = next(
        (e for e in recording if isinstance(e.data, OUTCOMES) and e.data.call_id == data.call_id),
        None,
    )
    return [] if outcome is None else [event.derive(outcome.data, source=SOURCE)]
