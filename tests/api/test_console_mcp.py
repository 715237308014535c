"""The console's MCP page in headless Chromium (Debian's, driven by Playwright): a server's
transport, health, breaker and figures, its resources and prompts, and a held tool's diff,
which an admin accepts from the keyboard; a viewer sees no accept button. Checked by axe and
at 320 px. Screenshots in test-artifacts/console/ (copied to docs/console/)."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, Page, expect

from helmline.runtime import EventStore, read_pin
from tests.api.conftest import KeyMaker
from tests.api.test_console import (  # noqa: F401  (fixtures: browser, page)
    browser,
    fits_320_px,
    page,
    screenshot,
    serious_violations,
)
from tests.api.test_mcp import POISONED, federate

pytestmark = pytest.mark.browser


async def test_the_mcp_page_shows_each_server_and_an_admin_accepts_a_held_tool_by_keyboard(
    page: Page,  # noqa: F811
    browser: Browser,  # noqa: F811
    api_url: str,
    store: EventStore,
    make_key: KeyMaker,
    tenant: str,
) -> None:
    federated = await federate(store)
    admin = await make_key(tenant, "admin")
    await page.goto(f"{api_url}/#key={admin['Authorization'].removeprefix('Bearer ')}")
    await page.get_by_role("link", name="MCP").click()
    await expect(page.get_by_role("link", name="MCP")).to_have_attribute("aria-current", "page")
    server = page.get_by_role("region", name=federated.server, exact=True)
    facts = server.locator(".mcp-facts")
    await expect(facts).to_contain_text("Transport stdio")
    await expect(facts).to_contain_text("Health degraded")
    await expect(facts).to_contain_text("Breaker half-open 2 failures in a row")
    await expect(facts).to_contain_text("Calls / min 0")
    await expect(facts).to_contain_text("1 held")
    held = server.locator(f'tr[data-tool="{federated.held}"]')
    await expect(held).to_contain_text("held: changed")
    await expect(held.locator(".mcp-diff .added")).to_contain_text(POISONED.description)
    await expect(server.locator(f'tr[data-tool="{federated.steady}"]')).to_contain_text("pinned")
    resources = page.get_by_role("region", name=f"Resources of {federated.server}")
    await expect(resources).to_contain_text("docs://guide")
    await expect(resources).to_contain_text(f"{federated.server}__read_resource")
    prompts = page.get_by_role("region", name=f"Prompts of {federated.server}")
    await expect(prompts).to_contain_text("summarise()")
    assert await serious_violations(page) == []
    await screenshot(page, "mcp")
    # The diff and the form too fit a narrow window (long lines wrap).
    drawn = f'.mcp-server[data-server="{federated.server}"] .mcp-diff'
    await fits_320_px(browser, api_url, admin, "#/mcp", drawn, "mcp-320px")

    # From the keyboard: the reason, then the button, then Enter.
    form = page.get_by_role("form", name=f"Accept the change of {federated.held}")
    await form.get_by_label("Reason").focus()
    await page.keyboard.type("reviewed with the vendor")
    await page.keyboard.press("Tab")
    await expect(form.get_by_role("button", name="Accept change")).to_be_focused()
    await page.keyboard.press("Enter")
    notice = page.locator("#mcp-notice")
    await expect(notice).to_have_text(
        f"Accepted the change of {federated.held}: its calls run again."
    )
    await expect(notice).to_be_focused()
    await expect(held).to_contain_text("pinned")
    await expect(held.locator(".mcp-diff")).to_have_count(0)
    pin = await read_pin(store.js, federated.held)
    assert pin is not None
    assert pin.digest == POISONED.digest


async def test_a_viewer_sees_a_held_tool_but_no_accept_button(
    page: Page,  # noqa: F811
    api_url: str,
    store: EventStore,
    make_key: KeyMaker,
    tenant: str,
) -> None:
    federated = await federate(store)
    viewer = await make_key(tenant, "viewer")
    await page.goto(f"{api_url}/#key={viewer['Authorization'].removeprefix('Bearer ')}")
    await page.goto(f"{api_url}/#/mcp")
    held = page.locator(f'tr[data-tool="{federated.held}"]')
    await expect(held).to_contain_text("Its calls are refused until an admin accepts the change.")
    await expect(held.get_by_role("button")).to_have_count(0)
    await expect(page).to_have_url(re.compile("#/mcp$"))
    assert await serious_violations(page) == []
