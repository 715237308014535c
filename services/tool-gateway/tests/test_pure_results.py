"""A pure tool's result answered from the log when a session makes the same call again,
against a real MCP server that counts the calls it receives, behind a real gateway."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js import JetStreamContext

from helmline.contracts import Actor, ToolCallCompleted, ToolCallStarted
from helmline.runtime import EventStore, SealingKey, SecretStore

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    calls_received,
    federated,
    gateway_in_process,
    write_servers_file,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")


async def _completed(calls: Calls, call_id: str) -> ToolCallCompleted:
    outcome = await calls.outcome(call_id)
    assert isinstance(outcome, ToolCallCompleted), outcome
    return outcome


@pytest.mark.parametrize("pure", [True, False])
async def test_a_session_calling_a_pure_tool_again_alike_gets_the_first_result_unsent(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    pure: bool,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        tools={"note": {"pure": pure}},
    )
    note = f"{server_id}__note"
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        first = await _completed(calls, await calls.authorise(note, message="a"))
        again_id = await calls.authorise(note, message="a")
        again = await _completed(calls, again_id)
        assert again.output == first.output
        if pure:
            assert again.cached_from == first.call_id
            assert calls_received(state_dir, "note") == 1
            # Answered from the log: never started on the server.
            assert not any(isinstance(e, ToolCallStarted) for e in await calls.events(again_id))
        else:
            assert again.cached_from is None
            assert calls_received(state_dir, "note") == 2


async def test_other_arguments_and_sessions_call_a_pure_tool_and_a_new_gateway_keeps_results(
    nats_url: str,
    js: JetStreamContext,
    store: EventStore,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        tools={"note": {"pure": True}},
        rate_limit={"calls": 3, "per_s": 600},
    )
    note = f"{server_id}__note"
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        first = await _completed(calls, await calls.authorise(note, message="a"))
        other_arguments = await _completed(calls, await calls.authorise(note, message="b"))
        assert other_arguments.cached_from is None
        other_session = Calls(store, tenant)
        assert other_session.session_id != calls.session_id
        elsewhere_id = await other_session.authorise(note, message="a")
        elsewhere = await _completed(other_session, elsewhere_id)
        assert elsewhere.cached_from is None
        assert calls_received(state_dir, "note") == 3
    # A gateway started afresh (or another replica) finds what the first one remembered, and
    # an answer from the log counts against no rate limit: the three calls sent used it up.
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        again = await _completed(calls, await calls.authorise(note, message="a"))
        assert (again.cached_from, again.output) == (first.call_id, first.output)
        assert calls_received(state_dir, "note") == 3


async def test_a_pure_call_that_refers_to_a_secret_is_always_sent(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    key = SealingKey.generate()
    await (await SecretStore.open(js, key)).set(
        tenant, "NOTE_SECRET", "note-secret-value-1", by=Actor(id="test")
    )
    servers = write_servers_file(
        tmp_path / "servers.yaml", server_id, state_dir, tools={"note": {"pure": True}}
    )
    note = f"{server_id}__note"
    async with gateway_in_process(nats_url, servers, tenant, secrets_key=key.text()):
        await federated(js, server_id)
        for _ in range(2):
            done = await _completed(
                calls, await calls.authorise(note, message={"secret": "NOTE_SECRET"})
            )
            assert done.cached_from is None
            assert "note-secret-value-1" not in done.model_dump_json()
        # The value may have changed under its name: the server is asked each time.
        assert calls_received(state_dir, "note") == 2
