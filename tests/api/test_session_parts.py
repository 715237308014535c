"""A session in parts: its overview, its list line, steps and calls by range and filter, its
checkpoints by range with what a rollback to each would undo, its log by sequence, and what
changed since a sequence, as the console reads a long session."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any

import httpx

from helmline.api._plan_graph import layers_of
from helmline.api._session_parts import NAMED, checkpoints_from
from helmline.contracts import (
    CheckpointState,
    FileChanges,
    SessionState,
    StepState,
    Table,
    ThoughtRecorded,
    Vector,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import checkpointed, eventually
from tests.api.conftest import KeyMaker
from tests.api.test_api import assert_problem, start, until


def chain(steps: int, tool: str = "echo") -> dict[str, Any]:
    return {
        "goal": f"{steps} echoes",
        "steps": [
            {
                "id": f"s{i}",
                "tool": tool,
                "arguments": {"message": f"step {i}"},
                "depends_on": [f"s{i - 1}"] if i else [],
            }
            for i in range(steps)
        ],
    }


async def test_a_long_session_is_read_in_parts(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    viewer = await make_key(tenant, "admin")
    playbook = chain(6)
    playbook["steps"][-1]["requires_approval"] = True  # It waits there, and ends no sooner.
    session_id = await start(client, viewer, playbook)
    await until(client, viewer, session_id, "waiting")
    base = f"/sessions/{session_id}"

    whole = await client.get(base, headers=viewer)
    overview = (await client.get(f"{base}/overview", headers=viewer)).json()
    assert overview["state"]["status"] == "waiting"
    assert overview["state"]["steps"] == {}  # The steps come by range.
    assert [a["step_id"] for a in overview["state"]["approvals"].values()] == ["s5"]
    assert overview["steps_total"] == 6
    assert overview["steps_by_status"]["succeeded"] == 5
    assert overview["tools"] == {"echo": 6}
    # Services may still add to a session that ended (its snapshots, say).
    assert overview["last_seq"] >= int(whole.headers["X-Last-Seq"])

    # Its line of the session list, from its log (the list's projection may trail it).
    line = (await client.get(f"{base}/summary", headers=viewer)).json()
    assert (line["session_id"], line["status"], line["goal"]) == (session_id, "waiting", "6 echoes")
    assert (line["steps_total"], line["steps_succeeded"]) == (6, 5)
    assert [(w["step_id"], w["tool"]) for w in line["waiting_for"]] == [("s5", "echo")]
    assert line["last_seq"] >= overview["last_seq"]
    assert_problem(await client.get("/sessions/no-such-session/summary", headers=viewer), 404)

    page = (await client.get(f"{base}/steps?offset=2&limit=3", headers=viewer)).json()
    assert page["total"] == 6
    assert [(i["position"], i["step"]["id"]) for i in page["items"]] == [
        (2, "s2"),
        (3, "s3"),
        (4, "s4"),
    ]
    assert page["items"][0]["step"] == whole.json()["steps"]["s2"]
    failed = (await client.get(f"{base}/steps?status=failed", headers=viewer)).json()
    assert (failed["total"], failed["items"]) == (0, [])
    echoes = await client.get(f"{base}/steps?status=succeeded&tool=echo&offset=4", headers=viewer)
    assert [i["step"]["id"] for i in echoes.json()["items"]] == ["s4"]
    assert echoes.json()["total"] == 5
    # A search of ids and tools, in any case.
    found = (await client.get(f"{base}/steps?q=S3", headers=viewer)).json()
    assert [i["step"]["id"] for i in found["items"]] == ["s3"]
    by_tool = (await client.get(f"{base}/steps?q=ECH&status=scheduled", headers=viewer)).json()
    assert [i["step"]["id"] for i in by_tool["items"]] == ["s5"]
    # Runs of succeeded steps folded, each into one row, unless unfolded.
    folded = (await client.get(f"{base}/steps?fold=3", headers=viewer)).json()
    assert folded["total"] == 2
    assert folded["items"][0] == {"first": "s0", "last": "s4", "steps": 5, "position": 0}
    assert folded["items"][1]["step"]["id"] == "s5"
    short = (
        await client.get(
            f"{base}/steps?fold=3&q=s&offset=1&status=succeeded&tool=echo", headers=viewer
        )
    ).json()
    assert (short["total"], short["items"]) == (1, [])
    unfolded = (await client.get(f"{base}/steps?fold=3&unfold=s0", headers=viewer)).json()
    assert [i["step"]["id"] for i in unfolded["items"]] == [f"s{i}" for i in range(6)]
    past = (await client.get(f"{base}/steps?offset=99", headers=viewer)).json()
    assert (past["total"], past["items"]) == (6, [])

    jumped = (await client.get(f"{base}/steps/s4", headers=viewer)).json()
    assert (jumped["position"], jumped["call_index"]) == (4, 4)
    assert_problem(await client.get(f"{base}/steps/s99", headers=viewer), 404, "no step s99")

    calls = (await client.get(f"{base}/calls?offset=3&limit=2", headers=viewer)).json()
    assert calls["total"] == overview["calls_total"] >= 5
    assert [(c["index"], c["step"]["step"]["id"], c["latest"]) for c in calls["items"]] == [
        (3, "s3", True),
        (4, "s4", True),
    ]

    # The log by sequence, a page at a time.
    first = (await client.get(f"{base}/log?limit=3", headers=viewer)).json()
    assert (len(first["items"]), first["more"]) == (3, True)
    assert first["items"][0]["event"]["type"] == "session.started"
    after = first["items"][-1]["seq"]
    rest = (await client.get(f"{base}/log?after_seq={after}&limit=500", headers=viewer)).json()
    seqs = [e["seq"] for e in first["items"] + rest["items"]]
    assert seqs == sorted(seqs)
    assert seqs[-1] == rest["last_seq"] >= overview["last_seq"]
    assert rest["more"] is False

    # Changes since a point: the steps the later events touched, as they are now.
    s4_done = next(
        e["seq"]
        for e in rest["items"]
        if e["event"]["type"] == "tool.call.completed" and e["event"]["data"]["step_id"] == "s4"
    )
    changes = (await client.get(f"{base}/changes?since={s4_done}", headers=viewer)).json()
    assert changes["reset"] is False
    named = [e["event"]["data"].get("step_id") for e in rest["items"] if e["seq"] > s4_done]
    # In the order the events first named them (checkpoints trail their steps).
    assert [s["step"]["id"] for s in changes["steps"]] == list(dict.fromkeys(filter(None, named)))
    assert "s5" in named
    assert changes["overview"]["last_seq"] >= rest["last_seq"]
    nothing = await client.get(f"{base}/changes?since={rest['last_seq']}", headers=viewer)
    assert (nothing.json()["reset"], nothing.json()["steps"]) == (False, [])
    # From the start: the session's start touches every step, so read them again.
    assert (await client.get(f"{base}/changes?since=0", headers=viewer)).json()["reset"] is True


async def test_a_range_out_of_bounds_is_refused_with_a_problem(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    viewer = await make_key(tenant, "admin")
    session_id = await start(client, viewer, chain(1))
    await until(client, viewer, session_id, "completed")
    base = f"/sessions/{session_id}"
    last_seq = (await client.get(f"{base}/overview", headers=viewer)).json()["last_seq"]
    for query, field in (
        ("steps?limit=0", "limit"),
        ("rollback-points?limit=501", "limit"),
        ("rollback-points?offset=-1", "offset"),
        ("rollback-points?offset=many", "offset"),
        ("thoughts?limit=0", "limit"),
        ("thoughts?offset=-3", "offset"),
        ("steps?limit=501", "limit"),
        ("calls?offset=-1", "offset"),
        ("steps?status=sleeping", "status"),
        ("changes", "since"),
        ("log?after_seq=-5", "after_seq"),
    ):
        response = await client.get(f"{base}/{query}", headers=viewer)
        assert_problem(response, 422, field)
    beyond = await client.get(f"{base}/changes?since={last_seq + 10}", headers=viewer)
    assert_problem(beyond, 422, "query.since", "past the session's last event")
    beyond = await client.get(f"{base}/log?after_seq={last_seq + 10}", headers=viewer)
    assert_problem(beyond, 422, "query.after_seq")
    parts = ("overview", "steps", "calls", "rollback-points", "thoughts", "log", "changes?since=0")
    for part in parts:
        missing = await client.get(f"/sessions/nope/{part}", headers=viewer)
        assert_problem(missing, 404, "nope")


async def test_checkpoints_are_read_by_range_with_what_a_rollback_to_each_undoes(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    viewer = await make_key(tenant, "viewer")
    session_id = await start(client, operator, chain(6))
    await until(client, viewer, session_id, "completed")
    await checkpointed(store, tenant, session_id)
    base = f"/sessions/{session_id}"
    whole = (await client.get(f"{base}/checkpoints", headers=viewer)).json()
    assert [c["step_id"] for c in whole] == [f"s{i}" for i in range(6)]

    page = (await client.get(f"{base}/rollback-points?offset=2&limit=2", headers=viewer)).json()
    assert (page["total"], page["offset"]) == (6, 2)
    assert [(i["index"], i["checkpoint"]) for i in page["items"]] == [(2, whole[2]), (3, whole[3])]
    reach = page["items"][0]["rollback"]
    assert (reach["later"], reach["steps"], reach["blocking"]) == (3, 3, 0)
    assert [u["step_id"] for u in reach["undoes"]] == ["s5", "s4", "s3"]  # Newest first.
    assert page["items"][0]["step_status"] == "succeeded"
    newest = (await client.get(f"{base}/rollback-points?offset=5", headers=viewer)).json()
    assert newest["items"][0]["rollback"]["later"] == 0
    past = (await client.get(f"{base}/rollback-points?offset=99", headers=viewer)).json()
    assert (past["total"], past["items"]) == (6, [])


async def test_thoughts_are_read_by_range(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    session_id = await start(client, operator, chain(1))
    await until(client, operator, session_id, "completed")
    for i in range(5):
        thought = ThoughtRecorded(kind="reasoning", text=f"thought {i}")
        await store.append(new_event(thought, tenant=tenant, session_id=session_id, source="test"))
    base = f"/sessions/{session_id}"

    page = (await client.get(f"{base}/thoughts?offset=1&limit=2", headers=operator)).json()
    assert (page["total"], page["offset"]) == (5, 1)
    assert [t["text"] for t in page["items"]] == ["thought 1", "thought 2"]
    past = (await client.get(f"{base}/thoughts?offset=9", headers=operator)).json()
    assert (past["total"], past["items"]) == (5, [])


def test_a_rollback_reach_names_the_latest_steps_and_counts_the_rest() -> None:
    made = datetime(2026, 1, 1)
    changed = FileChanges(created=("a",), modified=("b",), unlisted=2)
    checkpoints = [
        CheckpointState(
            checkpoint_id=f"c{i}",
            step_id=f"s{i}",
            at_seq=i + 1,
            created_at=made,
            reversible=i != 20,
            changes=changed if i % 2 else None,
            snapshot_id=f"w{i}",
        )
        for i in range(30)
    ]
    steps = Table(
        (f"s{i}", StepState(id=f"s{i}", status="undone" if i >= 28 else "succeeded"))
        for i in range(30)
    )
    state = SessionState(
        steps=steps,
        checkpoints=Vector(checkpoints),
        unrestorable_snapshots=Table([("w1", "pruned")]),
    )
    first, second = checkpoints_from(state, 1, 2)
    assert (first.index, second.index) == (1, 2)
    assert (first.workspace_lost, second.workspace_lost) == ("pruned", None)
    reach = first.rollback
    # Steps s2..s27 are undone by it; s28 and s29 were undone already.
    assert (reach.later, reach.steps) == (28, 26)
    assert [u.step_id for u in reach.undoes] == [f"s{i}" for i in range(27, 27 - NAMED, -1)]
    assert reach.file_changes == 4 * 13  # The odd ones of s3..s27.
    assert (reach.blocking, reach.blocking_steps) == (1, ["s20"])
    assert checkpoints_from(state, 29, 5)[0].rollback.later == 0
    assert checkpoints_from(state, 30, 5) == []


def diamond_with_a_tail(tail: int) -> dict[str, Any]:
    """`a`, then `b` and `c` in parallel, then `d` after both, then a chain of `tail` steps;
    `d` asks a person first."""
    steps: list[dict[str, Any]] = [
        {"id": "a", "tool": "echo", "arguments": {"message": "a"}},
        {"id": "b", "tool": "echo", "arguments": {"message": "b"}, "depends_on": ["a"]},
        {"id": "c", "tool": "echo", "arguments": {"message": "c"}, "depends_on": ["a"]},
        {
            "id": "d",
            "tool": "echo",
            "arguments": {"message": "d"},
            "depends_on": ["b", "c"],
            "requires_approval": True,
        },
    ]
    for i in range(tail):
        before = "d" if i == 0 else f"t{i - 1}"
        steps.append(
            {"id": f"t{i}", "tool": "echo", "arguments": {"message": "t"}, "depends_on": [before]}
        )
    return {"goal": "a diamond", "steps": steps}


async def test_the_plan_graph_is_a_window_of_layers_around_the_current_step(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin, diamond_with_a_tail(20))
    await until(client, admin, session_id, "waiting")
    base = f"/sessions/{session_id}"

    graph = (await client.get(f"{base}/graph?layers=3", headers=admin)).json()
    assert (graph["steps_total"], graph["layers_total"]) == (24, 23)
    assert graph["current"] == graph["focus"] == "d"  # It waits there for a person.
    assert graph["first_layer"] == 1
    assert [(x["layer"], x["steps"], x["shown"]) for x in graph["layers"]] == [
        (1, 2, 2),
        (2, 1, 1),
        (3, 1, 1),
    ]
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert list(nodes) == ["b", "c", "d", "t0"]
    assert nodes["d"]["depends_on"] == ["b", "c"]
    assert nodes["b"]["hidden_depends_on"] == 1  # `a`, above the window.
    assert graph["before"] == {"succeeded": 1}
    assert graph["after"] == {"pending": 19}

    # Another step to centre on, one a layer at most, as the plan was at an earlier point.
    top = (await client.get(f"{base}/graph?focus=a&layers=2&per_layer=1", headers=admin)).json()
    assert [n["id"] for n in top["nodes"]] == ["a", "b"]
    assert top["layers"][1] == {"layer": 1, "steps": 2, "by_status": {"succeeded": 2}, "shown": 1}
    bottom = (await client.get(f"{base}/graph?layer=22&layers=3", headers=admin)).json()
    assert (bottom["focus"], bottom["first_layer"]) == ("t19", 20)
    log = (await client.get(f"{base}/log?limit=500", headers=admin)).json()["items"]
    scheduled = ("step.scheduled", "step.authorized")
    first_call = next(e["seq"] for e in log if e["event"]["type"] in scheduled)
    planned = (await client.get(f"{base}/graph?at_seq={first_call - 1}", headers=admin)).json()
    assert planned["current"] == "a"
    assert {n["status"] for n in planned["nodes"]} == {"pending"}
    then = (await client.get(f"{base}/overview?at_seq={first_call - 1}", headers=admin)).json()
    assert then["steps_by_status"] == {"pending": 24}

    for query, field in (
        ("graph?focus=zz", "query.focus"),
        ("graph?layers=0", "layers"),
        ("graph?layer=23", "the plan has 23 layers"),
        ("graph?per_layer=101", "per_layer"),
        ("graph?at_seq=0", "at_seq"),
        ("overview?at_seq=0", "at_seq"),
    ):
        assert_problem(await client.get(f"{base}/{query}", headers=admin), 422, field)

    # The call that waited for a person says for how long, and who serves it.
    waiting = (await client.get(f"{base}/steps/d", headers=admin)).json()
    assert waiting["server"] == "builtin"
    assert waiting["approval_wait_ms"] is not None
    assert waiting["approval_wait_ms"] >= 0
    assert (await client.get(f"{base}/steps/a", headers=admin)).json()["approval_wait_ms"] is None


async def test_sessions_that_ended_lately_are_listed_by_when_they_ended(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin, chain(1))
    ended = await until(client, admin, session_id, "completed")
    ended_at = datetime.fromisoformat(ended["ended_at"])

    async def listed(after: datetime) -> list[str]:
        query = {"ended_after": after.isoformat(), "status": "completed"}
        return [
            s["session_id"]
            for s in (await client.get("/sessions", params=query, headers=admin)).json()
        ]

    assert session_id in await eventually(
        lambda: _non_empty(listed(ended_at - timedelta(minutes=1))), timeout_s=10, what="listed"
    )
    assert session_id not in await listed(ended_at + timedelta(minutes=1))
    naive = await client.get("/sessions?ended_after=2026-01-01T00:00:00", headers=admin)
    assert_problem(naive, 422, "ended_after")


async def _non_empty(found: Awaitable[list[str]]) -> list[str] | None:
    return (await found) or None


def test_a_step_s_layer_is_its_longest_chain_of_dependencies_whatever_their_order() -> None:
    def steps(*pairs: tuple[str, tuple[str, ...]]) -> list[StepState]:
        return [StepState(id=step_id, depends_on=deps) for step_id, deps in pairs]

    # `c` is declared before `b`, which it waits for; `d` waits for both; `x` for no step
    # of the plan.
    plan = steps(("a", ()), ("c", ("b",)), ("b", ("a",)), ("d", ("b", "c")), ("x", ("gone",)))
    assert layers_of(plan) == {"a": 0, "b": 1, "c": 2, "d": 3, "x": 0}
    # A chain longer than any recursion limit, declared last step first.
    chain = steps(*((f"s{i}", (f"s{i + 1}",) if i < 4_999 else ()) for i in range(5_000)))
    layers = layers_of(chain)
    assert (layers["s4999"], layers["s0"]) == (0, 4_999)
