"""A session in parts: its overview, steps and calls by range and filter, its log by
sequence, and what changed since a sequence, as the console reads a long session."""

from __future__ import annotations

from typing import Any

import httpx

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
    assert len(first["items"]) == 3
    assert first["items"][0]["event"]["type"] == "session.started"
    after = first["items"][-1]["seq"]
    rest = (await client.get(f"{base}/log?after_seq={after}&limit=500", headers=viewer)).json()
    seqs = [e["seq"] for e in first["items"] + rest["items"]]
    assert seqs == sorted(seqs)
    assert seqs[-1] == rest["last_seq"] >= overview["last_seq"]

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
    for part in ("overview", "steps", "calls", "log", "changes?since=0"):
        missing = await client.get(f"/sessions/nope/{part}", headers=viewer)
        assert_problem(missing, 404, "nope")
