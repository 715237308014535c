"""The web console in headless Chromium (Debian's, driven by Playwright) on long sessions.

For sessions of 10, 1,000 and 4,500 echo steps (see `STEPS`), once ended: the time from
navigation to the first screen (the summary counts every step and the plan's first row is
drawn), the elements in the page then, the renderer's memory (resident set of Chromium's
renderer processes, the largest, shared pages included; and the page's JavaScript heap
after a garbage collection), the bytes the page read from the API, and the longest frame
while the plan is scrolled from top to bottom; then the elements and bytes once the
session's events list, at the foot of the page, is scrolled to and has read its first page.
Then the live lag: a 3,000-step session runs at full speed with its page open, and each
step's success is timed from its event's time in the log to the moment the page first
counts it. `HELMLINE_CONSOLE_STEPS=10,100` and
`HELMLINE_CONSOLE_LIVE_STEPS=1000` run other lengths (0: no live session).

A session of 10,000 steps cannot be started from a playbook (see `STEPS`), so its page is
measured on a log written here as the planner and the tool gateway would write an `act`
session's (a step scheduled, then its call completed, 10,000 times, then the end), with the
folded states the state service would have stored of it, on a nats-server with only the API
running (`SYNTHETIC_STEPS`).

Needs Debian's chromium (`tools/system_packages.py`); without it the lines say so.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright
from steps import api_alone, echo_chain, percentile, run_sessions, services_running

from helmline.api import new_api_key, store_api_key
from helmline.contracts import (
    Actor,
    Event,
    Payload,
    SessionCompleted,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    new_event,
)
from helmline.runtime import EventStore, FoldedStates
from helmline.runtime.testing import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    SHOWN_STEP_COUNTS,
    display_lags,
    free_port,
)

STEPS = (10, 1_000, 4_500)
"""The longest a playbook can be: a session's start carries its playbook, and an echo chain
of 10,000 steps is 2.1 MB, more than the log takes in one event (1 MiB); 4,500 steps fit."""
LIVE_STEPS = 3_000
SYNTHETIC_STEPS = 10_000
WRITE_BATCH = 500
TENANT = "console"
TIMEOUT_MS = 600_000

# Scrolls the plan's box from top to bottom a screen a frame, and says the longest frame.
SCROLL_THROUGH = """
async () => {
  const box = document.getElementById("steps-box");
  const frames = [];
  let last = performance.now();
  while (box.scrollTop + box.clientHeight < box.scrollHeight - 1) {
    box.scrollTop += box.clientHeight;
    await new Promise((resolve) => requestAnimationFrame(resolve));
    const now = performance.now();
    frames.push(now - last);
    last = now;
  }
  frames.sort((a, b) => a - b);
  const p95 = frames[Math.floor(frames.length * 0.95)] ?? 0;
  return { frames: frames.length, max: frames.at(-1) ?? 0, p95 };
}
"""

API_BYTES = """
performance.getEntriesByType("resource")
  .filter((entry) => /\\/sessions\\//.test(entry.name))
  .reduce((sum, entry) => sum + entry.encodedBodySize, 0)
"""


async def run() -> list[dict[str, Any]]:
    if not await asyncio.to_thread(CHROMIUM.exists):
        return [{"figure": "console", "skipped": "Debian package chromium is missing"}]
    port = free_port()
    os.environ["HELMLINE_API_PORT"] = str(port)
    figures = []
    try:
        async with services_running() as (nc, store, services), async_playwright() as pw:
            await asyncio.to_thread(services.start, "api")
            key, record = new_api_key(TENANT, ("admin",), name="bench")
            await store_api_key(nc.jetstream(), record, by=Actor(id="bench"))
            base = f"http://127.0.0.1:{port}"
            browser = await pw.chromium.launch(
                executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS)
            )
            chosen = os.environ.get("HELMLINE_CONSOLE_STEPS")
            for steps in [int(n) for n in chosen.split(",")] if chosen else STEPS:
                (session_id,), _ = await run_sessions(nc, store, TENANT, [echo_chain(steps)])
                figures.append(await _opened(browser, base, key, session_id, steps))
            live = int(os.environ.get("HELMLINE_CONSOLE_LIVE_STEPS", LIVE_STEPS))
            if live:
                figures.append(await _live(browser, store, base, key, live))
            await browser.close()
        figures.append(await _synthetic(port))
    finally:
        os.environ.pop("HELMLINE_API_PORT", None)
    return figures


async def _synthetic(port: int) -> dict[str, Any]:
    """A 10,000-step session's page, its log written here with only the API running."""
    with tempfile.TemporaryDirectory() as folder:
        async with api_alone(Path(folder), port, TENANT, "admin") as (nc, store, _, key):
            session_id = uuid.uuid4().hex
            events = _act_session(session_id, SYNTHETIC_STEPS)
            for first in range(0, len(events), WRITE_BATCH):
                appended = await store.append_pipelined(events[first : first + WRITE_BATCH])
            # The states the state service would have stored of it as it ran.
            await FoldedStates(nc.jetstream(), store).keep_up(TENANT, session_id, appended[-1].seq)
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS)
                )
                base = f"http://127.0.0.1:{port}"
                figure = await _opened(browser, base, key, session_id, SYNTHETIC_STEPS)
                await browser.close()
    return {**figure, "log": "written as an act session's, only the API running"}


def _act_session(session_id: str, steps: int) -> list[Event]:
    """The events an act session of `steps` echo calls leaves, in order."""

    def event(payload: Payload) -> Event:
        return new_event(payload, tenant=TENANT, session_id=session_id, source="bench")

    goal = f"{steps} echoes, one at a time"
    events = [event(SessionStarted(goal=goal, mode="act", requested_by=Actor(id="bench")))]
    for i in range(steps):
        call = {"step_id": f"s{i}", "call_id": f"c{i}", "tool": "echo"}
        events.append(event(StepScheduled(**call, arguments={"message": f"step {i}"})))
        events.append(event(ToolCallCompleted(**call, output={"message": f"step {i}"})))
    events.append(event(SessionCompleted(summary=f"{steps} echoes")))
    return events


async def _signed_in(browser: Browser, base: str, key: str, script: str = "") -> Page:
    context = await browser.new_context(viewport={"width": 1280, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    if script:
        await page.add_init_script(script)
    await page.goto(f"{base}/#key={key}")
    await page.wait_for_selector("#session-rows")
    return page


async def _opened(
    browser: Browser, base: str, key: str, session_id: str, steps: int
) -> dict[str, Any]:
    page = await _signed_in(browser, base, key)
    began = time.perf_counter()
    await page.goto(f"{base}/#/sessions/{session_id}")
    await page.wait_for_function(
        f"""() => document.getElementById("summary")?.textContent.includes("{steps}/{steps} steps")
             && document.querySelector("#steps > li[data-step-id]") !== null"""
    )
    first_screen_s = time.perf_counter() - began
    elements = await page.evaluate("document.getElementsByTagName('*').length")
    api_bytes = await page.evaluate(API_BYTES)
    memory_mb = await _renderer_mb(browser)
    heap_mb = await _heap_mb(page)
    scrolled = await page.evaluate(SCROLL_THROUGH)
    after_scroll = await page.evaluate("document.getElementsByTagName('*').length")
    # The log, at the foot of the page: its first page is read once it comes on screen.
    await page.locator("#events-part").scroll_into_view_if_needed()
    await page.wait_for_selector("#events > li.event-row")
    figure = {
        "figure": "console_session_page",
        "steps": steps,
        "first_screen_s": round(first_screen_s, 3),
        "dom_elements": elements,
        "renderer_mb": memory_mb,
        "js_heap_mb": heap_mb,
        "api_bytes": api_bytes,
        "scroll_frames": scrolled["frames"],
        "scroll_frame_max_ms": round(scrolled["max"], 1),
        "scroll_frame_p95_ms": round(scrolled["p95"], 1),
        "dom_elements_after_scroll": after_scroll,
        "dom_elements_with_events": await page.evaluate(
            "document.getElementsByTagName('*').length"
        ),
        "api_bytes_with_events": await page.evaluate(API_BYTES),
        "target": "10,000 steps: first screen <= 1 s, <= 3,000 elements, renderer <= 200 MB, "
        "no frame over 50 ms scrolling",
    }
    await page.context.close()
    return figure


async def _renderer_mb(browser: Browser) -> float | None:
    """The largest resident set of Chromium's renderer processes, in MB."""
    cdp = await browser.new_browser_cdp_session()
    try:
        info = await cdp.send("SystemInfo.getProcessInfo")
    finally:
        await cdp.detach()
    renderers = [p["id"] for p in info["processInfo"] if p["type"] == "renderer"]
    sizes = [size for pid in renderers if (size := _resident_mb(pid)) is not None]
    return round(max(sizes), 1) if sizes else None


async def _heap_mb(page: Page) -> float:
    """The page's JavaScript heap in use, in MB, after a garbage collection."""
    cdp = await page.context.new_cdp_session(page)
    try:
        await cdp.send("HeapProfiler.collectGarbage")
        await cdp.send("Performance.enable")
        metrics = (await cdp.send("Performance.getMetrics"))["metrics"]
    finally:
        await cdp.detach()
    used = next(m["value"] for m in metrics if m["name"] == "JSHeapUsedSize")
    return round(used / 2**20, 1)


def _resident_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


async def _live(
    browser: Browser, store: EventStore, base: str, key: str, steps: int
) -> dict[str, Any]:
    page = await _signed_in(browser, base, key, SHOWN_STEP_COUNTS)
    playbook = echo_chain(steps)
    started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=Actor(id="bench"))
    event = new_event(started, tenant=TENANT, session_id=uuid.uuid4().hex, source="bench")
    await store.append(event)
    await page.goto(f"{base}/#/sessions/{event.session_id}")
    done = f"{steps}/{steps} steps"
    await page.wait_for_function(
        f"""() => document.getElementById("summary")?.textContent.includes("{done}")"""
    )
    shown: list[list[int]] = await page.evaluate("window.shownCounts")
    finished = sorted(
        [
            stored.event.time.timestamp() * 1000
            async for stored in store.read(TENANT, event.session_id)
            if isinstance(stored.event.data, ToolCallCompleted)
        ]
    )
    lags = display_lags(finished, shown)
    figure = {
        "figure": "console_live_lag_ms",
        "steps": steps,
        "session_s": round((finished[-1] - finished[0]) / 1000, 2),
        "counts_shown": len(shown),
        "p50": round(percentile(lags, 0.5)),
        "p95": round(percentile(lags, 0.95)),
        "max": round(max(lags)),
        "dom_elements": await page.evaluate("document.getElementsByTagName('*').length"),
        "renderer_mb": await _renderer_mb(browser),
        "js_heap_mb": await _heap_mb(page),
        "target": "p95 <= 1,000 ms while a 3,000-step session runs at full speed",
    }
    await page.context.close()
    return figure
