"""The planner's decisions, as pure functions of a session's state and the latest event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from helmline.contracts import (
    Actor,
    Event,
    ForkOrigin,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRequested,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    StepAuthorization,
    StepAuthorized,
    StepScheduled,
    StepSkipped,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCircuitChanged,
    ToolError,
    WorkspaceRestored,
    call_digest,
    fold,
    new_event,
)
from helmline.planner._domain import Decision, decide, retry_deferral

ANA = Actor(id="ana")


class Session:
    """Drives `decide` the way the service does: fold, decide, append the decisions."""

    def __init__(self, playbook: Playbook, fork_of: ForkOrigin | None = None) -> None:
        self.root = new_event(
            SessionStarted(
                goal=playbook.goal, playbook=playbook, requested_by=ANA, fork_of=fork_of
            ),
            tenant="t",
            session_id="s1",
            source="test",
        )
        self.events: list[Event] = []
        self.happen(self.root)

    def happen(self, event_or_payload: Event | Payload) -> list[Payload]:
        event = (
            event_or_payload
            if isinstance(event_or_payload, Event)
            else self.root.derive(event_or_payload, source="test", key=str(len(self.events)))
        )
        self.events.append(event)
        decisions = decide(fold(self.events), event)
        for index, decision in enumerate(decisions):
            self.events.append(event.derive(decision.payload, source="planner", key=str(index)))
        return [d.payload for d in decisions]

    def complete(self, step_id: str) -> list[Payload]:
        step = fold(self.events).steps[step_id]
        assert step.call_id is not None
        return self.happen(ToolCallCompleted(call_id=step.call_id, step_id=step_id, tool=step.tool))


def _chain() -> Playbook:
    return Playbook(
        goal="g",
        steps=(
            PlanStep(id="a", tool="echo"),
            PlanStep(id="b", tool="echo"),
            PlanStep(id="c", tool="echo", depends_on=("a", "b")),
        ),
    )


def _scheduled(payloads: list[Payload]) -> list[str]:
    return [p.step_id for p in payloads if isinstance(p, StepScheduled)]


def test_independent_steps_are_scheduled_together_and_the_join_after_both() -> None:
    session = Session(_chain())
    assert _scheduled(session.happen(PlanApproved(revision=1, approved_by=ANA))) == ["a", "b"]
    assert session.complete("a") == []
    assert _scheduled(session.complete("b")) == ["c"]
    (completed,) = session.complete("c")
    assert isinstance(completed, SessionCompleted)
    assert completed.summary == "3 of 3 steps succeeded"


def test_a_playbook_plan_is_estimated_up_front_from_its_steps_estimates() -> None:
    steps = tuple(
        step.model_copy(update={"estimated_duration_s": seconds})
        for step, seconds in zip(_chain().steps, (4.0, 1.5, 2.0), strict=True)
    )
    session = Session(Playbook(goal="g", steps=steps))
    (proposed,) = [e.data for e in session.events if isinstance(e.data, PlanProposed)]
    assert proposed.estimated_duration_s == 6.0  # a and b side by side, then c
    state = fold(session.events)
    assert state.plan_estimated_duration_s == 6.0
    assert state.plan_permissions == ("echo",)
    assert [s.estimated_duration_s for s in state.steps.values()] == [4.0, 1.5, 2.0]


def test_a_replan_rewires_which_steps_a_finished_step_releases() -> None:
    session = Session(_chain())
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    # As a goal session's planner replans: pending c is superseded, and d waits for a alone.
    session.happen(StepSkipped(step_id="c", reason="replaced by plan revision 2"))
    replanned = (
        PlanStep(id="a", tool="echo"),
        PlanStep(id="b", tool="echo"),
        PlanStep(id="d", tool="echo", depends_on=("a",)),
    )
    session.happen(PlanProposed(revision=2, steps=replanned))
    session.happen(PlanApproved(revision=2, approved_by=ANA))
    assert "d" in fold(session.events).steps["a"].dependants
    assert _scheduled(session.complete("a")) == ["d"]
    assert _scheduled(session.complete("b")) == []


def test_nothing_runs_before_the_plan_is_approved() -> None:
    session = Session(_chain())
    assert fold(session.events).plan_revision == 1
    assert _scheduled(session.happen(SessionResumeRequested(requested_by=ANA))) == []


def test_a_retryable_failure_is_retried_then_fails_the_session() -> None:
    session = Session(Playbook(goal="g", steps=(PlanStep(id="a", tool="echo"),)))
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    error = ToolError(kind="timeout", message="slow", retryable=True)
    for attempt in (1, 2):
        (retry,) = session.happen(
            ToolCallFailed(call_id=f"a.{attempt}", step_id="a", tool="echo", error=error)
        )
        assert isinstance(retry, StepScheduled)
        assert retry.attempt == attempt + 1
    (failed,) = session.happen(ToolCallFailed(call_id="a.3", step_id="a", tool="echo", error=error))
    assert isinstance(failed, SessionFailed)
    assert "step 'a' failed: slow" in failed.reason


def test_a_retry_waits_for_an_open_circuit_to_let_a_probe_through() -> None:
    playbook = Playbook(goal="g", steps=(PlanStep(id="a", tool="srv__t"),))
    session = Session(playbook)
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    unavailable = ToolError(kind="unavailable", message="circuit open", retryable=True)
    failed = ToolCallFailed(call_id="a.1", step_id="a", tool="srv__t", error=unavailable)
    failure = session.root.derive(failed, source="t")
    (retry,) = decide(fold([*session.events, failure]), failure)
    reopens = datetime(2030, 1, 1, tzinfo=UTC)

    def circuit(state: Literal["closed", "open", "half_open"]) -> ToolCircuitChanged:
        return ToolCircuitChanged(server="srv", state=state, previous="closed", retry_at=reopens)

    deferral = retry_deferral([retry], failed, circuit("open"))
    assert deferral is not None
    assert (deferral.step_id, deferral.call_id, deferral.retry_at) == ("a", "a.1", reopens)
    assert "srv" in deferral.reason
    assert retry_deferral([retry], failed, circuit("half_open")) is None  # A probe may pass.
    assert retry_deferral([retry], failed, circuit("closed")) is None
    assert retry_deferral([retry], failed, None) is None  # Never announced: no reason to wait.
    # The last attempt failed: the session fails now, there is no retry to put off.
    ends = [Decision(SessionFailed(reason="step 'a' failed"))]
    assert retry_deferral(ends, failed, circuit("open")) is None

    # Recorded, the wait shows on the step until the retry is scheduled.
    waiting = session.root.derive(deferral, source="t")
    step = fold([*session.events, failure, waiting]).steps["a"]
    assert (step.status, step.retry_at, step.reason) == ("failed", reopens, deferral.reason)
    rescheduled = session.root.derive(retry.payload, source="t", key="retry")
    step = fold([*session.events, failure, waiting, rescheduled]).steps["a"]
    assert (step.status, step.retry_at, step.reason) == ("scheduled", None, None)


def test_a_retry_waits_until_the_failure_says_it_may_succeed() -> None:
    session = Session(Playbook(goal="g", steps=(PlanStep(id="a", tool="srv__t"),)))
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    limited = ToolError(kind="rate_limited", message="5 calls per 60 s", retryable=True)
    frees = datetime(2030, 1, 1, tzinfo=UTC)
    failed = ToolCallFailed(
        call_id="a.1", step_id="a", tool="srv__t", error=limited, retry_at=frees
    )
    failure = session.root.derive(failed, source="t")
    (retry,) = decide(fold([*session.events, failure]), failure)

    deferral = retry_deferral([retry], failed, None)
    assert deferral is not None
    assert (deferral.call_id, deferral.retry_at, deferral.reason) == (
        "a.1",
        frees,
        "5 calls per 60 s",
    )
    # With an open circuit too, the later of the two times.
    for reopens, expected in (
        (frees + timedelta(seconds=5), "circuit"),
        (frees - timedelta(seconds=5), "5 calls"),
    ):
        circuit = ToolCircuitChanged(
            server="srv", state="open", previous="closed", retry_at=reopens
        )
        both = retry_deferral([retry], failed, circuit)
        assert both is not None
        assert both.retry_at == max(frees, reopens)
        assert expected in both.reason
    # A failure that names no time is retried at once.
    assert retry_deferral([retry], failed.model_copy(update={"retry_at": None}), None) is None


def test_a_denial_fails_the_session_or_skips_the_step_and_its_dependants() -> None:
    failing = Session(_chain())
    failing.happen(PlanApproved(revision=1, approved_by=ANA))
    (failed,) = failing.happen(ToolCallDenied(call_id="a.1", step_id="a", tool="echo", reason="no"))
    assert isinstance(failed, SessionFailed)

    continuing = Session(_chain().model_copy(update={"on_denied": "continue"}))
    continuing.happen(PlanApproved(revision=1, approved_by=ANA))
    skipped = continuing.happen(
        ToolCallDenied(call_id="a.1", step_id="a", tool="echo", reason="no")
    )
    assert [p.step_id for p in skipped if isinstance(p, StepSkipped)] == ["a", "c"]
    (completed,) = continuing.complete("b")
    assert isinstance(completed, SessionCompleted)


def test_pause_holds_new_steps_until_resumed() -> None:
    session = Session(_chain())
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    session.happen(SessionPauseRequested(requested_by=ANA))
    session.complete("a")
    assert session.complete("b") == []
    resumed = session.happen(SessionResumeRequested(requested_by=ANA))
    assert isinstance(resumed[0], SessionResumed)
    assert _scheduled(resumed) == ["c"]


def test_cancel_ends_the_session_and_nothing_follows() -> None:
    session = Session(_chain())
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    (cancelled,) = session.happen(SessionCancelRequested(requested_by=ANA, reason="stop"))
    assert isinstance(cancelled, SessionCancelled)
    assert session.complete("a") == []


_CHAIN = Playbook(
    goal="g",
    steps=(
        PlanStep(id="a", tool="echo"),
        PlanStep(id="b", tool="echo", depends_on=("a",)),
        PlanStep(id="c", tool="echo", depends_on=("b",)),
    ),
)


def test_nothing_starts_during_a_rollback_and_undone_steps_run_again_on_resume() -> None:
    session = Session(_CHAIN)
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    session.complete("a")
    session.happen(RollbackRequested(rollback_id="rb", checkpoint_id="cp-a.1", requested_by=ANA))
    assert session.complete("b") == [], "a step finishing during a rollback starts nothing"

    assert (
        session.happen(
            RollbackCompleted(rollback_id="rb", checkpoint_id="cp-a.1", undone_steps=("b",))
        )
        == []
    )
    assert fold(session.events).status == "paused"

    resumed, again = session.happen(SessionResumeRequested(requested_by=ANA))
    assert isinstance(resumed, SessionResumed)
    assert isinstance(again, StepScheduled)
    assert (again.step_id, again.attempt, again.call_id) == ("b", 2, "b.2")
    session.complete("b")
    (completed,) = session.complete("c")
    assert isinstance(completed, SessionCompleted)


def test_a_session_completes_again_after_a_rollback_under_a_new_identity() -> None:
    session = Session(_CHAIN)
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    for step in ("a", "b"):
        session.complete(step)
    (first,) = session.complete("c")
    session.happen(RollbackRequested(rollback_id="rb", checkpoint_id="cp-b.1", requested_by=ANA))
    session.happen(RollbackCompleted(rollback_id="rb", checkpoint_id="cp-b.1", undone_steps=("c",)))
    session.happen(SessionResumeRequested(requested_by=ANA))
    (second,) = session.complete("c")

    assert isinstance(first, SessionCompleted)
    assert isinstance(second, SessionCompleted)
    ends = [e for e in session.events if isinstance(e.data, SessionCompleted)]
    assert len({e.id for e in ends}) == 2, "the second end is not taken for a duplicate"


def test_a_fork_runs_only_what_its_origin_had_not_done_once_its_workspace_is_restored() -> None:
    origin = ForkOrigin(session_id="src", at_seq=9, snapshot_id="snap-a", completed_steps=("a",))
    session = Session(_CHAIN, fork_of=origin)

    assert session.happen(PlanApproved(revision=1, approved_by=ANA)) == []
    (scheduled,) = session.happen(WorkspaceRestored(snapshot_id="snap-a"))

    assert isinstance(scheduled, StepScheduled)
    assert scheduled.step_id == "b"
    assert fold(session.events).steps["a"].tool == "echo"


def test_a_step_its_approved_plan_authorised_is_scheduled_as_authorised() -> None:
    steps = (PlanStep(id="a", tool="echo"), PlanStep(id="b", tool="echo", depends_on=("a",)))
    session = Session(Playbook(goal="g", steps=steps))
    authorized = StepAuthorization(
        step_id="a", call_digest=call_digest("echo", {}), risk="low", rule="the-rest"
    )
    (first,) = session.happen(
        PlanApproved(revision=1, approved_by=ANA, authorized_steps=(authorized,))
    )
    assert isinstance(first, StepAuthorized)
    assert first.authorized_by_plan == 1
    state = fold(session.events)
    # The log says the call may run: the fold shows it as authorised, as a decision would.
    assert (state.steps["a"].status, state.steps["a"].risk) == ("authorized", "low")
    (second,) = session.complete("a")
    # Not authorised with the plan: judged.
    assert type(second) is StepScheduled
    assert second.authorized_by_plan is None
    assert fold(session.events).steps["b"].status == "scheduled"
