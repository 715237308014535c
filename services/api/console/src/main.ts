// The Helmline console: the session list and one session's view, kept live by SSE.

import { type Accepted, api, ApiError, type Connection, EventFeed, keepKey, type RollbackAccepted, storedKey, type StreamEvent, Unauthorized } from "./api";
import type { Approval, CallAt, CheckpointAt, Me, PermissionNeed, RangePage, SessionChanges, SessionOverview, SessionState, SessionSummary, Step, StepAt, StepRun } from "./types";
import { setHtml, VirtualList } from "./virtual";
import { compareWithOrigin } from "./compare";
import { EventLog } from "./events";
import { CheckpointTimeline } from "./checkpoints";
import { ThoughtList } from "./thoughts";
import { fleetView } from "./fleet";
import { mcpView } from "./mcp";
import { linesFromLogs, newestFirst, startedAt } from "./lines";
import { PlanGraphView } from "./graph";
import { CallTimeline } from "./timeline";
import { TimeTravel } from "./travel";
import { badge, duration, esc, json, onScreen, throttle, when } from "./ui";
import "./style.css";

const main = document.getElementById("main") as HTMLElement;
const connection = document.getElementById("connection") as HTMLElement;
const who = document.getElementById("who") as HTMLElement;
const confirmDialog = document.getElementById("confirm") as HTMLDialogElement;

let feed: EventFeed | null = null;
let teardown: (() => void) | null = null;
// Counts navigations. A view is built over several requests, and a person (or a test)
// may navigate again meanwhile: the older view's work stops at its next step, rather than
// take the live feed from the newer one or draw over it.
let navigations = 0;
type Current = () => boolean;
// How the approval service answers a person's decision.
const ANSWERS = new Set(["approval.granted", "approval.denied", "approval.vote_counted", "approval.decision_refused"]);

/** Conditions and other contract values without the fields left out (null). */
function compact(value: unknown): string {
  return esc(JSON.stringify(value, (_key, field: unknown) => (field === null ? undefined : field)));
}
/** A tool's error as people read it: what went wrong, then what to do about it. */
function errorText(error: unknown): string {
  const e = (error ?? {}) as { kind?: unknown; message?: unknown; suggestion?: unknown };
  const what = `${String(e.kind ?? "error")}: ${String(e.message ?? "")}`;
  return esc(e.suggestion ? `${what}\n${String(e.suggestion)}` : what);
}
function showConnection(state: Connection): void {
  const labels: Record<Connection, string> = {
    connecting: "connecting…",
    live: "live",
    reconnecting: "connection lost — reconnecting…",
  };
  connection.textContent = labels[state];
  connection.dataset.state = state;
}

/** The shortest run of succeeded steps the plan folds into one row, when asked. */
const FOLD_RUNS_OF = 3;
/** As many sessions as the API lists by default. */
const LIST_LIMIT = 100;
/** At most how many lines behind an event heard are read from their sessions' logs at once. */
const LINES_READ_AHEAD = 10;
/** How long the list is read again while a line stays behind an event heard. */
const CATCH_UP_FOR_MS = 10_000;

function follow(path: string, onEvent: (event: StreamEvent) => void): void {
  feed?.stop();
  feed = new EventFeed(path, onEvent, showConnection);
}

// ---- sign in ---------------------------------------------------------------------------

function signIn(message = ""): void {
  feed?.stop();
  who.textContent = "";
  main.innerHTML = `
    <section class="signin">
      <h1>Sign in</h1>
      <p>Paste an API key (<code>helmline console</code> prints an address that signs in with the development key).</p>
      ${message ? `<p class="error" role="alert">${esc(message)}</p>` : ""}
      <form id="signin">
        <label>API key <input name="key" type="password" autocomplete="off" required autofocus></label>
        <button type="submit">Sign in</button>
      </form>
    </section>`;
  main.querySelector("form")!.addEventListener("submit", (event) => {
    event.preventDefault();
    keepKey(new FormData(event.target as HTMLFormElement).get("key") as string);
    void route();
  });
}

// ---- session list ------------------------------------------------------------------------

async function sessionList(current: Current): Promise<void> {
  main.innerHTML = `
    <section>
      <h1>Sessions</h1>
      <label class="filter">Status
        <select id="status-filter">
          <option value="">any</option>
          ${["waiting", "executing", "planning", "paused", "completed", "failed", "cancelled"].map((s) => `<option>${s}</option>`).join("")}
        </select>
      </label>
      <p class="hint">Keys: <kbd>j</kbd>/<kbd>k</kbd> move, <kbd>Enter</kbd> opens, <kbd>Esc</kbd> goes back.</p>
      <table class="sessions" aria-label="Sessions">
        <thead><tr><th>Status</th><th>Goal</th><th>Waiting for</th><th>Steps</th><th>Started</th></tr></thead>
        <tbody id="session-rows"><tr><td colspan="5">loading…</td></tr></tbody>
      </table>
      <p id="list-state" class="hint" role="status" aria-live="polite"></p>
    </section>`;
  const filter = document.getElementById("status-filter") as HTMLSelectElement;
  // The list is read from a projection that trails the event stream: each line says the last
  // event it reflects, and while a line is behind an event heard, the list is read again.
  const heard = new Map<string, number>();
  let behindSince: number | null = null;
  const render = async (): Promise<void> => {
    const query = filter.value ? `?status=${encodeURIComponent(filter.value)}` : "";
    const sessions = await lineByLine(await api<SessionSummary[]>(`/sessions${query}`));
    const rows = document.getElementById("session-rows");
    if (!rows || !current()) return;
    rows.innerHTML = sessions.length
      ? sessions
          .map(
            (s) => `
        <tr data-session="${esc(s.session_id)}">
          <td data-label="Status">${badge(s.status, s.status)}</td>
          <td><a href="#/sessions/${esc(s.session_id)}" class="session-link">${esc(s.goal)}</a></td>
          <td data-label="Waiting for">${s.waiting_for.map((w) => `${badge(w.risk, w.risk)} ${esc(w.tool ?? "plan")} <small>(${esc(w.step_id ?? "")})</small>`).join("<br>")}</td>
          <td data-label="Steps">${s.steps_succeeded}/${s.steps_total}${s.steps_failed ? ` · ${s.steps_failed} failed` : ""}</td>
          <td data-label="Started">${esc(when(s.started_at))}</td>
        </tr>`,
          )
          .join("")
      : `<tr><td colspan="5">No sessions yet.</td></tr>`;
    const listed = new Map(sessions.map((s) => [s.session_id, s.last_seq]));
    // A session heard of but not listed is behind only where the list has room for it.
    const complete = !filter.value && sessions.length < LIST_LIMIT;
    const behind = [...heard].some(([id, seq]) => (listed.get(id) ?? (complete ? 0 : seq)) < seq);
    const now = performance.now();
    behindSince = behind ? (behindSince ?? now) : null;
    const state = document.getElementById("list-state");
    if (state) state.textContent = behind ? "behind the live events — catching up…" : "";
    // Read again until caught up; a line that never catches up (a projection stopped) is
    // not read for ever: the note stays, and the next event heard tries again.
    if (behindSince !== null && now - behindSince < CATCH_UP_FOR_MS) refresh();
  };
  /** The list as read, with each line behind an event heard (or missing from it) read from
   * its session's log instead: the projection trails a busy stream by seconds, and a session
   * that comes to wait for a person must show at once. The latest heard first, a few. */
  const lineByLine = async (sessions: SessionSummary[]): Promise<SessionSummary[]> => {
    const listed = new Map(sessions.map((s) => [s.session_id, s]));
    const behind = [...heard]
      .filter(([id, seq]) => (listed.get(id)?.last_seq ?? 0) < seq)
      .sort((a, b) => b[1] - a[1])
      .slice(0, LINES_READ_AHEAD)
      .map(([id]) => id);
    const read = await linesFromLogs(behind);
    const last = sessions.length ? startedAt(sessions[sessions.length - 1]) : -Infinity;
    for (const line of read) {
      if (filter.value && line.status !== filter.value) {
        listed.delete(line.session_id); // It left the filter's list.
        continue;
      }
      const known = listed.get(line.session_id);
      // A line missing from a full list joins it only where it sorts among those listed.
      const fits = known || sessions.length < LIST_LIMIT || startedAt(line) >= last;
      if (fits && line.last_seq > (known?.last_seq ?? 0)) listed.set(line.session_id, line);
    }
    return newestFirst(listed.values());
  };
  const refresh = throttle(render, fail);
  await render();
  if (!current()) return;
  // The whole list is read again, at most every LIVE_EVERY_MS while any session's events
  // flow: a busy session cannot hold back another that starts, or comes to wait, meanwhile.
  filter.addEventListener("change", refresh);
  follow("/events", (event) => {
    heard.set(event.data.sessionid, event.seq);
    behindSince = null;
    refresh();
  });
}

// ---- one session ----------------------------------------------------------------------------

/** A try of a call that failed and that the gateway made again, as heard live. */
interface RetryHeard {
  attempt: number;
  error: unknown;
  retry_in_s: number;
}

/** Step statuses (the contract's StepStatus), in the order the filter offers them. */
const STEP_STATUSES = ["pending", "scheduled", "authorized", "running", "succeeded", "failed", "denied", "skipped", "undone"];

async function sessionView(sessionId: string, current: Current): Promise<void> {
  main.innerHTML = `
    <section class="session">
      <p><a href="#/">← Sessions</a></p>
      <div id="summary"></div>
      <div id="controls" class="controls" role="toolbar" aria-label="Session controls">
        <button data-action="pause" accesskey="p">Pause</button>
        <button data-action="resume" accesskey="r">Resume</button>
        <button data-action="cancel" class="danger" accesskey="c">Cancel</button>
      </div>
      <p id="notice" role="status" aria-live="polite"></p>
      <section id="approvals" aria-label="Approvals" aria-live="polite"></section>
      <div id="grants"></div>
      <section id="compare-part" aria-labelledby="compare-title" hidden><h2 id="compare-title">Compared with its origin</h2><div class="compare"></div></section>
      <nav class="page-nav" aria-label="Parts of the session">
        <a href="#steps-box" data-skip="steps-box">Plan</a> <a href="#graph-part" data-skip="graph-part">Graph</a>
        <a href="#calls-box" data-skip="calls-box">Tool calls</a> <a href="#timeline-part" data-skip="timeline-part">Timeline</a> <a href="#travel-part" data-skip="travel-part">Time travel</a>
        <a href="#thoughts-box" data-skip="thoughts-box">Thoughts</a> <a href="#checkpoints-part" data-skip="checkpoints-part">Checkpoints</a> <a href="#events-box" data-skip="events-box">Events</a>
      </nav>
      <form id="list-tools" class="list-tools" role="search" aria-label="Steps and calls">
        <label>Status <select id="step-status" name="status"><option value="">any</option></select></label>
        <label>Tool <select id="step-tool" name="tool"><option value="">any</option></select></label>
        <label>Search <input id="step-search" name="q" type="search" autocomplete="off" size="12" placeholder="step or tool"></label>
        <label><input id="fold-runs" type="checkbox"> Fold runs of succeeded steps</label>
        <label>Go to step <input id="jump-to" name="step" autocomplete="off" size="10"></label>
        <button type="submit">Go</button>
      </form>
      <div class="columns">
        <section><h2 id="plan-title">Plan</h2>
          <div id="steps-box" class="virtual-box" tabindex="-1" role="group" aria-labelledby="plan-title" aria-describedby="list-keys">
            <ol id="steps" class="timeline virtual"></ol></div>
          <p id="list-keys" class="hint">In a list: <kbd>↑</kbd>/<kbd>↓</kbd>, <kbd>Page Up</kbd>/<kbd>Page Down</kbd>, <kbd>Home</kbd>/<kbd>End</kbd> move; <kbd>Enter</kbd> opens.</p></section>
        <section><h2 id="thoughts-title">Thoughts <span id="thinking"></span></h2>
          <div id="thoughts-box" class="virtual-box thoughts" tabindex="-1" role="group" aria-labelledby="thoughts-title" aria-describedby="list-keys">
            <ol id="thoughts" class="virtual"></ol></div></section>
      </div>
      <section id="graph-part" aria-labelledby="graph-title" tabindex="-1"><h2 id="graph-title">Plan graph</h2>
        <p class="hint">Arrow keys move between steps; <kbd>Enter</kbd> shows the step in the plan.</p>
        <div id="graph" class="graph"></div></section>
      <section><h2 id="calls-title">Tool calls</h2>
        <div id="calls-box" class="virtual-box" tabindex="-1" role="group" aria-labelledby="calls-title" aria-describedby="list-keys">
          <ol id="calls" class="virtual calls"></ol></div></section>
      <section id="timeline-part" aria-labelledby="timeline-title" tabindex="-1"><h2 id="timeline-title">Tool-call timeline</h2>
        <div id="timeline"></div></section>
      <section id="travel-part" aria-labelledby="travel-title" tabindex="-1"><h2 id="travel-title">Time travel</h2>
        <p class="hint">The session as it was after any point of its log: move the slider (arrow keys, <kbd>Page Up</kbd>/<kbd>Page Down</kbd>), or pick a checkpoint below.</p>
        <div id="travel"></div></section>
      <section id="checkpoints-part" aria-labelledby="checkpoints-title" tabindex="-1"><h2 id="checkpoints-title">Checkpoints</h2>
        <p id="checkpoints-count" class="hint"></p>
        <div id="checkpoints-box" class="virtual-box" tabindex="-1" role="group" aria-labelledby="checkpoints-title" aria-describedby="list-keys">
          <ol id="checkpoints" class="timeline virtual"></ol></div><div id="rollbacks"></div></section>
      <section id="events-part" aria-labelledby="events-title"><h2 id="events-title">Events</h2>
        <p id="events-count" class="hint"></p>
        <div id="events-box" class="virtual-box" tabindex="-1" role="group" aria-labelledby="events-title" aria-describedby="list-keys">
          <ol id="events" class="virtual events"></ol></div></section>
    </section>`;

  let overview: SessionOverview | null = null;
  let state: SessionState | null = null;
  /** The stream sequence the page reflects: changes are asked for since it. */
  let applied = 0;
  const openDetails = new Set<string>();
  const openCalls = new Set<string>();
  const retriesHeard = new Map<string, RetryHeard[]>();
  let approvalKey: string | null = null;
  const statusField = document.getElementById("step-status") as HTMLSelectElement;
  const toolField = document.getElementById("step-tool") as HTMLSelectElement;
  const searchField = document.getElementById("step-search") as HTMLInputElement;
  const foldField = document.getElementById("fold-runs") as HTMLInputElement;
  /** Runs of succeeded steps a person unfolded, by their first step. */
  const unfolded = new Set<string>();
  // Filtered or folded, a row's index is not its step's position: changes read rows again.
  const filtered = (): boolean => statusField.value !== "" || toolField.value !== "" || searchField.value.trim() !== "" || foldField.checked;
  const rangeQuery = (offset: number, limit: number): URLSearchParams => {
    const query = new URLSearchParams({ offset: String(offset), limit: String(limit) });
    if (statusField.value) query.append("status", statusField.value);
    if (toolField.value) query.append("tool", toolField.value);
    if (searchField.value.trim()) query.append("q", searchField.value.trim());
    return query;
  };
  const stepsQuery = (offset: number, limit: number): URLSearchParams => {
    const query = rangeQuery(offset, limit);
    if (foldField.checked) query.append("fold", String(FOLD_RUNS_OF));
    for (const first of unfolded) query.append("unfold", first);
    return query;
  };
  const steps = new VirtualList<StepAt | StepRun>({
    box: document.getElementById("steps-box")!,
    list: document.getElementById("steps")!,
    fetch: (offset, limit) => api<RangePage<StepAt | StepRun>>(`/sessions/${sessionId}/steps?${stepsQuery(offset, limit)}`),
    render: (at) => {
      if (!("step" in at)) return runItem(at);
      const s = state;
      const retry = s && s.status === "failed" && ["failed", "denied"].includes(at.step.status) ? retryPoint(s) : undefined;
      return stepItem(at.step, openDetails.has(at.step.id), retry);
    },
    empty: '<li class="empty"><small>No steps.</small></li>',
    onError: fail,
  });
  const calls = new VirtualList<CallAt>({
    box: document.getElementById("calls-box")!,
    list: document.getElementById("calls")!,
    fetch: (offset, limit) => api<RangePage<CallAt>>(`/sessions/${sessionId}/calls?${rangeQuery(offset, limit)}`),
    render: (call) => callItem(call, openCalls.has(call.call_id), retriesHeard.get(call.call_id) ?? []),
    empty: '<li class="empty"><small>No tool calls yet.</small></li>',
    estimate: 36,
    onError: fail,
  });

  const thoughts = new ThoughtList({
    box: document.getElementById("thoughts-box")!,
    list: document.getElementById("thoughts")!,
    sessionId,
    onError: fail,
  });
  const checkpoints = new CheckpointTimeline({
    box: document.getElementById("checkpoints-box")!,
    list: document.getElementById("checkpoints")!,
    sessionId,
    onError: fail,
  });
  const events = new EventLog({
    box: document.getElementById("events-box")!,
    list: document.getElementById("events")!,
    sessionId,
    onError: fail,
  });
  const graph = new PlanGraphView({
    box: document.getElementById("graph")!,
    sessionId,
    onPick: (stepId) => void jump(stepId),
    onError: fail,
  });
  const travel = new TimeTravel({
    box: document.getElementById("travel")!,
    sessionId,
    shown: () => travelShown.visible(),
    onPick: (stepId) => void jump(stepId),
    onError: fail,
  });
  const timeline = new CallTimeline({
    box: document.getElementById("timeline")!,
    sessionId,
    total: () => overview?.calls_total ?? 0,
    onError: fail,
  });
  // The graph and the timeline are read whole (a window of each) each time: less often
  // than the lists.
  const compared = (): Promise<void> => (overview ? compareWithOrigin(document.getElementById("compare-part")!, overview) : Promise.resolve());
  const graphShown = onScreen(document.getElementById("graph-part")!, () => void graph.refresh());
  const timelineShown = onScreen(document.getElementById("timeline-part")!, () => void timeline.refresh());
  const travelShown = onScreen(document.getElementById("travel-part")!, () => travel.wake());
  const eventsShown = onScreen(document.getElementById("events-part")!, () => events.start());
  const graphSoon = throttle(
    () =>
      Promise.all([graphShown.visible() && graph.refresh(), timelineShown.visible() && timeline.refresh()]).then(
        () => undefined,
      ),
    fail,
    1000,
  );
  // From the overview the page holds: asked for each time it changed.
  const comparedSoon = throttle(compared, fail, 1000);

  const notice = (text: string, error = false): void => {
    const el = document.getElementById("notice");
    if (el) {
      el.textContent = text;
      el.className = error ? "error" : "";
    }
  };
  const act = async (path: string, body: unknown, done: string): Promise<Accepted | null> => {
    try {
      const accepted = await api<Accepted>(`/sessions/${sessionId}/${path}`, { method: "POST", body });
      notice(done);
      return accepted;
    } catch (error) {
      if (error instanceof ApiError) notice(error.detail, true);
      else throw error;
      return null;
    }
  };

  // The approval service judges a decision after the API took it: the page says what came
  // of each sent from here. Answers carry their decision's event id as causation; one may
  // arrive before the API's response does.
  const unanswered = new Set<string>();
  const answers = new Map<string, StreamEvent>();
  const tellAnswer = (answer: StreamEvent): void => {
    const data = answer.data.data;
    if (answer.type === "approval.decision_refused") notice(`Your decision was refused: ${String(data.reason)}`, true);
    if (answer.type === "approval.vote_counted") notice(`Your approval counted: ${Number(data.grants)} of the ${Number(data.quorum)} approvers needed so far.`);
    if (answer.type === "approval.granted" && data.grant_scope) notice(`Granted for the ${String(data.grant_scope)} until ${when(String(data.grant_until))}.`);
    else if (answer.type === "approval.granted") notice(data.similar_limit ? `Approved, with the next ${Number(data.similar_limit)} similar calls.` : "Approved.");
    if (answer.type === "approval.denied") notice("Denied.");
  };
  const heard = (event: StreamEvent): void => {
    const cause = event.data.causationid;
    if (!cause || !ANSWERS.has(event.type)) return;
    if (unanswered.delete(cause)) tellAnswer(event);
    else answers.set(cause, event);
  };

  // A rollback asked for here is followed in the notice until it ends.
  let followedRollback: string | null = null;
  const tellRollback = (s: SessionState): void => {
    const r = followedRollback === null ? undefined : s.rollbacks[followedRollback];
    if (!r || r.status === "requested" || r.status === "running") return;
    followedRollback = null;
    if (r.status !== "completed") {
      notice(`Rollback ${r.status}: ${r.reason}`, true);
      return;
    }
    const undone = r.undone_steps.length ? `; undid ${r.undone_steps.join(", ")}` : "";
    notice(`Rolled back to ${r.checkpoint_id}${undone}. The session is paused: Resume runs the undone steps again.`);
  };

  const render = (): void => {
    if (!state || !overview) return;
    const s = state;
    const o = overview;
    tellRollback(s);
    setHtml(document.getElementById("summary")!, `
      <h1>${esc(s.goal)}</h1>
      <p>${badge(s.status, s.status)} ${s.pause_requested && s.status !== "paused" ? badge("paused", "pause requested") : ""}
        <small>${esc(s.mode)} · ${o.steps_by_status.succeeded ?? 0}/${o.steps_total} steps
        ${planFacts(s)} · started ${esc(when(s.started_at))}</small></p>
      ${criteriaList(s)}
      ${modelUsage(s)}
      ${s.fork_of ? `<p class="fork">started from <a href="#/sessions/${esc(s.fork_of.session_id)}">${esc(s.fork_of.session_id.slice(0, 12))}</a>${s.fork_of.completed_steps.length ? ` after ${esc(s.fork_of.completed_steps.join(", "))}` : ""}</p>` : ""}
      ${s.outcome ? `<p class="outcome">${esc(s.outcome)}</p>` : ""}`);
    const ended = ["completed", "failed", "cancelled"].includes(s.status);
    for (const button of document.querySelectorAll<HTMLButtonElement>("#controls button")) {
      const action = button.dataset.action;
      button.disabled = ended || (action === "pause" && (s.pause_requested || s.status === "paused")) || (action === "resume" && !s.pause_requested && s.status !== "paused");
    }
    renderApprovals(s);
    setHtml(
      document.getElementById("grants")!,
      Object.values(s.approvals)
        .filter((a) => a.status === "granted" && (a.similar_limit || a.permissions.length))
        .map((a) => (a.permissions.length ? permissionGrant(a) : standingGrant(a)))
        .join(""),
    );
    offerChoices(statusField, STEP_STATUSES.filter((x) => o.steps_by_status[x]));
    offerChoices(toolField, Object.keys(o.tools).sort());
    document.getElementById("thinking")!.textContent = !o.steps_underway && thinking(s) ? "thinking…" : "";
    renderCheckpoints(s, o);
    document.getElementById("events-count")!.textContent = `${s.event_count.toLocaleString("en")} event${s.event_count === 1 ? "" : "s"} in the session's log, oldest first.`;
  };

  const renderApprovals = (s: SessionState): void => {
    const pending = Object.values(s.approvals).filter((a) => a.status === "pending");
    const key = pending.map((a) => a.request_id).join(",");
    if (key === approvalKey) return; // Never wipe what a person is typing.
    approvalKey = key;
    document.getElementById("approvals")!.innerHTML = pending.map(approvalForm).join("");
  };

  const renderCheckpoints = (s: SessionState, o: SessionOverview): void => {
    const total = o.checkpoints_total;
    document.getElementById("checkpoints-count")!.textContent =
      total ? `${total.toLocaleString("en")} checkpoint${total === 1 ? "" : "s"}, oldest first: a rollback goes back to one of them.` : "";
    setHtml(document.getElementById("rollbacks")!, Object.values(s.rollbacks)
      .map((r) => `<p class="rollback">${badge(r.status, `rollback ${r.status}`)} to ${esc(r.checkpoint_id)}
        ${r.undone_steps.length ? ` · undone: ${esc(r.undone_steps.join(", "))}` : ""}
        ${r.blocking_steps.length ? ` · blocked by: ${esc(r.blocking_steps.join(", "))}` : ""}
        ${r.reason ? ` · ${esc(r.reason)}` : ""}</p>`)
      .join(""));
  };

  const adopt = (fresh: SessionOverview): void => {
    overview = fresh;
    state = fresh.state;
    checkpoints.follow(fresh);
    thoughts.follow(fresh);
    applied = fresh.last_seq;
    render();
    travel.span(fresh.last_seq).catch(fail);
    comparedSoon();
  };
  /** What changed since the page last looked: the overview, and the steps (and so the
   * calls) the events since touched, redrawn where they are on screen. */
  const refresh = async (): Promise<void> => {
    const changes = await api<SessionChanges>(`/sessions/${sessionId}/changes?since=${applied}`);
    if (!current()) return;
    adopt(changes.overview);
    if (changes.reset || filtered()) {
      // A filter's matches (and so every index) may have moved: the rows shown are read again.
      steps.reload(filtered() ? undefined : changes.overview.steps_total);
      calls.reload(filtered() ? undefined : changes.overview.calls_total);
      return;
    }
    steps.setTotal(changes.overview.steps_total);
    calls.setTotal(changes.overview.calls_total);
    for (const at of changes.steps) {
      steps.put(at.position, at);
      if (at.call_index !== null && at.step.call_id) calls.put(at.call_index, { index: at.call_index, call_id: at.step.call_id, latest: true, step: at });
    }
  };
  const refreshSoon = throttle(refresh, fail);

  const onEvent = (event: StreamEvent): void => {
    heard(event);
    events.heard(event);
    const data = event.data.data as Record<string, unknown>;
    if (event.type === "tool.call.attempt_failed") {
      const callId = String(data.call_id);
      retriesHeard.set(callId, [...(retriesHeard.get(callId) ?? []), { attempt: Number(data.attempt), error: data.error, retry_in_s: Number(data.retry_in_s) }]);
    }
    refreshSoon();
    graphSoon();
  };

  const refilter = (): void => {
    steps.reload(filtered() ? undefined : overview?.steps_total, true);
    calls.reload(filtered() ? undefined : overview?.calls_total, true);
  };
  statusField.addEventListener("change", refilter);
  toolField.addEventListener("change", refilter);
  searchField.addEventListener("input", throttle(async () => refilter(), fail));
  foldField.addEventListener("change", () => {
    unfolded.clear();
    refilter();
  });
  (document.getElementById("list-tools") as HTMLFormElement).addEventListener("submit", (event) => {
    event.preventDefault();
    const stepId = (document.getElementById("jump-to") as HTMLInputElement).value.trim();
    void jump(stepId).then((found) => (found ? graph.centre(stepId) : undefined));
  });
  const jump = async (stepId: string): Promise<boolean> => {
    if (!stepId) return false;
    try {
      const at = await api<StepAt>(`/sessions/${sessionId}/steps/${encodeURIComponent(stepId)}`);
      if (filtered()) {
        statusField.value = toolField.value = searchField.value = "";
        foldField.checked = false;
        refilter();
      }
      steps.put(at.position, at);
      steps.scrollTo(at.position, true);
      return true;
    } catch (error) {
      if (error instanceof ApiError) notice(error.detail, true);
      else throw error;
      return false;
    }
  };

  const noteOpen = (details: HTMLDetailsElement, open: boolean) => {
    const id = details.dataset?.step;
    if (id) (open ? openDetails.add(id) : openDetails.delete(id));
    const call = details.dataset?.call;
    if (call) (open ? openCalls.add(call) : openCalls.delete(call));
    // Drawn again with the row's details in (or out), and measured anew.
    if (id) steps.redraw();
    if (call) calls.redraw();
  };
  // A row's toggle event comes a task after the click (or Enter) that opened it: a redraw
  // in between replaces the row, and the event then reaches no one. So the state is noted
  // as the person acts, and again when the toggle comes.
  main.addEventListener("click", (event) => {
    const summary = (event.target as HTMLElement).closest("summary");
    const details = summary?.parentElement;
    if (!(details instanceof HTMLDetailsElement)) return;
    const run = details.dataset.run;
    if (run === undefined) return noteOpen(details, !details.open);
    // A folded run opens into its steps, in its place: the first of them takes the focus.
    event.preventDefault();
    unfolded.add(run);
    const row = Number(details.closest<HTMLElement>("li[data-index]")?.dataset.index ?? 0);
    steps.reload();
    steps.scrollTo(row, true);
  }, true);
  main.addEventListener("toggle", (event) => {
    const details = event.target as HTMLDetailsElement;
    noteOpen(details, details.open);
  }, true);

  main.onclick = (event) => {
    const button = (event.target as HTMLElement).closest("button");
    if (!button || !state) return;
    const action = button.dataset.action;
    if (action === "pause" || action === "resume") void act(action, {}, `${action} requested`);
    if (action === "cancel" && window.confirm("Cancel this session for good?")) void act("cancel", {}, "cancel requested");
    if (action === "grant" || action === "deny") void decide(button, action);
    const point = action === "rollback" ? checkpoints.itemOf(button) : undefined;
    if (point) rollback(point);
    if (action === "retry") void retry(button.dataset.session!, button.dataset.checkpoint!);
    if (action === "travel") {
      travel.go(Number(button.dataset.seq));
      document.getElementById("travel-part")!.scrollIntoView({ block: "start" });
    }
  };

  const retry = async (origin: string, checkpointId: string): Promise<void> => {
    try {
      const forked = await api<Accepted>(`/sessions/${origin}/fork`, { method: "POST", body: { checkpoint_id: checkpointId } });
      location.hash = `#/sessions/${forked.session_id}`;
    } catch (error) {
      if (error instanceof ApiError) notice(error.detail, true);
      else throw error;
    }
  };

  const decide = async (button: HTMLButtonElement, decision: "grant" | "deny"): Promise<void> => {
    const form = button.closest("form")!;
    const requestId = form.dataset.request!;
    const comment = (form.elements.namedItem("comment") as HTMLInputElement).value;
    const argumentsField = form.elements.namedItem("arguments") as HTMLTextAreaElement | null;
    const body: Record<string, unknown> = { decision, comment };
    if (decision === "grant" && argumentsField && argumentsField.value.trim() !== argumentsField.defaultValue.trim()) {
      try {
        body.modified_arguments = JSON.parse(argumentsField.value);
      } catch {
        notice("The modified arguments are not valid JSON.", true);
        argumentsField.focus();
        return;
      }
    }
    const scopeField = form.elements.namedItem("grant_scope") as HTMLSelectElement | null;
    if (decision === "grant" && scopeField) {
      body.grant_scope = scopeField.value;
      const lasting = Number((form.elements.namedItem("grant_for") as HTMLSelectElement).value);
      body.grant_until = new Date(Date.now() + lasting * 60_000).toISOString();
    }
    const similarField = form.elements.namedItem("similar") as HTMLInputElement | null;
    const similar = similarField ? Number(similarField.value || "0") : 0;
    if (decision === "grant" && similar !== 0) {
      if (!Number.isInteger(similar) || similar < 0 || similar > 1000) {
        notice("Similar calls to approve: a whole number from 0 to 1000.", true);
        similarField!.focus();
        return;
      }
      body.similar_limit = similar;
      const lasting = Number((form.elements.namedItem("similar_for") as HTMLSelectElement).value);
      body.similar_until = new Date(Date.now() + lasting * 60_000).toISOString();
      const whereField = form.elements.namedItem("similar_where") as HTMLInputElement;
      const where = whereField.value; // Untrimmed: a pattern's spaces may matter.
      if (where.trim()) {
        // As the CLI's --similar-where: whichever of = and ~ comes first ends the name.
        const at = Math.min(...[where.indexOf("="), where.indexOf("~")].filter((i) => i > 0));
        const name = Number.isFinite(at) ? where.slice(0, at).trim() : "";
        const value = Number.isFinite(at) ? where.slice(at + 1) : "";
        if (!name || !value) {
          notice("Only where: write NAME=GLOB (a path glob) or NAME~REGEX.", true);
          whereField.focus();
          return;
        }
        body.similar_where = { [name]: where[at] === "=" ? { glob: [value] } : { regex: value } };
      }
    }
    const accepted = await act(`approvals/${requestId}`, body, "Decision sent; waiting for the approval service…");
    if (!accepted) return;
    const answer = answers.get(accepted.event_id);
    if (answer) tellAnswer(answer);
    else unanswered.add(accepted.event_id);
  };

  const startRollback = async (checkpointId: string): Promise<void> => {
    const accepted = (await act("rollback", { checkpoint_id: checkpointId }, "Rolling back…")) as RollbackAccepted | null;
    if (!accepted) return;
    followedRollback = accepted.rollback_id;
    if (state) tellRollback(state); // It may have ended before the API answered.
  };

  const rollback = (point: CheckpointAt): void => {
    const { checkpoint, rollback: reach } = point;
    const checkpointId = checkpoint.checkpoint_id;
    const more = reach.steps - reach.undoes.length;
    (document.getElementById("confirm-title") as HTMLElement).textContent = `Roll back to after “${checkpoint.step_id}”?`;
    (document.getElementById("confirm-body") as HTMLElement).innerHTML = `
      <p>These steps will be undone, newest first:</p>
      <ol>${reach.undoes.map((u) => `<li>${esc(u.step_id)} <small>${esc(u.compensation ?? "")}</small></li>`).join("")}</ol>
      ${more > 0 ? `<p>and ${more.toLocaleString("en")} earlier step${more === 1 ? "" : "s"}.</p>` : ""}`;
    confirmDialog.returnValue = "";
    confirmDialog.showModal();
    (document.getElementById("confirm-ok") as HTMLButtonElement).focus();
    confirmDialog.addEventListener(
      "close",
      () => {
        if (confirmDialog.returnValue === "ok") void startRollback(checkpointId);
      },
      { once: true },
    );
  };

  adopt(await api<SessionOverview>(`/sessions/${sessionId}/overview`));
  if (!current()) return;
  steps.setTotal(overview!.steps_total);
  calls.setTotal(overview!.calls_total);
  // Live from the sequence the overview reflects: the events before are in it.
  follow(`/sessions/${sessionId}/events?after=${applied}`, onEvent);
  const below = [graphShown, timelineShown, travelShown, eventsShown];
  teardown = () => {
    main.onclick = null;
    for (const observed of below) observed.stop();
  };
  // The views below the lists are watched from the frame after the lists' first draw, when
  // they have their height: watched from the first layout, they were on screen for a moment
  // above lists still empty, and so drawn (and kept) on a page that shows only the lists.
  await new Promise((drawn) => requestAnimationFrame(drawn));
  if (current()) for (const observed of below) observed.start();
}

interface RetryPoint {
  session: string;
  checkpoint: string;
}

/** A failed session stays as it ended: its failed step is tried again in a new session
 * forked from its latest checkpoint (a fork that has none yet: from the checkpoint it was
 * forked from), whose completed steps do not run again. Null: there is no checkpoint. */
function retryPoint(s: SessionState): RetryPoint | null {
  const latest = s.checkpoints.at(-1);
  if (latest) return { session: s.session_id, checkpoint: latest.checkpoint_id };
  if (s.fork_of?.checkpoint_id) return { session: s.fork_of.session_id, checkpoint: s.fork_of.checkpoint_id };
  return null;
}

/** What the latest plan says of itself up front. */
function planFacts(s: SessionState): string {
  const facts = [];
  if (s.plan_confidence !== null) facts.push(`plan confidence ${Math.round(s.plan_confidence * 100)} %`);
  if (s.plan_estimated_duration_s !== null) facts.push(`about ${duration(s.plan_estimated_duration_s)}`);
  if (s.plan_permissions.length) facts.push(`needs ${s.plan_permissions.join(", ")}`);
  const count = s.completion_criteria.length;
  if (count) facts.push(`${s.criteria_required ?? count} of ${count} criteria must be met`);
  return facts.map((fact) => ` · ${esc(fact)}`).join("");
}

function retries(count: number): string {
  return count === 1 ? "1 retry" : `${count} retries`;
}

/** Calls, tokens and cost of each model the session asked, with the totals. */
function modelUsage(s: SessionState): string {
  if (!s.model_usage.length) return "";
  const cost = (usd: number): string => (usd ? `$${usd.toFixed(4)}` : "–");
  const rows = s.model_usage.map(
    (m) => `<tr><th scope="row">${esc(m.model)}</th><td>${m.calls}</td><td>${m.input_tokens}</td><td>${m.output_tokens}</td><td>${cost(m.cost_usd)}</td></tr>`,
  );
  const total = `<tr><th scope="row">all models</th><td>${s.model_calls}</td><td colspan="2">${s.tokens_used} tokens</td><td>${cost(s.cost_usd)}</td></tr>`;
  return `<table class="usage"><caption>Model usage</caption>
    <thead><tr><th scope="col">model</th><th scope="col">calls</th><th scope="col">input tokens</th><th scope="col">output tokens</th><th scope="col">cost</th></tr></thead>
    <tbody>${rows.join("")}${s.model_usage.length > 1 ? total : ""}</tbody></table>`;
}

/** The completion criteria as the planner checked them when the session ended. */
function criteriaList(s: SessionState): string {
  if (!s.criteria.length) return "";
  const items = s.criteria.map((c) => `<li>${badge(c.met ? "succeeded" : "failed", c.met ? "met" : "not met")} ${esc(c.criterion)}${c.evidence ? ` <small>${esc(c.evidence)}</small>` : ""}</li>`);
  return `<ul class="criteria">${items.join("")}</ul>`;
}

/** Whether the planner is deciding what comes next: before its first plan, and in a goal
 * session whenever nothing of its plan is under way, which is while its model is asked. */
function thinking(s: SessionState): boolean {
  if (s.pause_requested || !["planning", "executing"].includes(s.status)) return false;
  const underway = Object.values(s.steps).some((x) => ["pending", "scheduled", "authorized", "running"].includes(x.status) || x.retry_at !== null);
  return !underway && (s.mode !== "playbook" || s.plan_revision === 0);
}

/** `retryFrom`: for a step whose failure ended the session, where a retry starts. */
function stepItem(step: Step, open: boolean, retryFrom?: RetryPoint | null): string {
  const retry =
    retryFrom === undefined
      ? ""
      : retryFrom === null
        ? `<button type="button" disabled title="no checkpoint yet: start the session again">Retry in a new session</button>`
        : `<button type="button" data-action="retry" data-session="${esc(retryFrom.session)}" data-checkpoint="${esc(retryFrom.checkpoint)}"
            title="a new session from the latest checkpoint; completed steps do not run again">Retry in a new session</button>`;
  return `<li class="step ${esc(step.status)}" data-step-id="${esc(step.id)}">
    <details data-step="${esc(step.id)}" ${open ? "open" : ""}>
      <summary>${badge(step.status, step.status)} <strong>${esc(step.id)}</strong> ${esc(step.tool)}
        ${step.risk ? badge(step.risk, step.risk) : ""}${step.requires_approval ? badge("waiting", "plan asks approval") : ""}
        ${step.duration_ms !== null ? ` <small>${step.duration_ms.toFixed(0)} ms</small>` : step.estimated_duration_s !== null ? ` <small>about ${esc(duration(step.estimated_duration_s))}</small>` : ""}
        ${step.attempts > 1 ? ` <small>attempt ${step.attempts}</small>` : ""}${step.retries ? ` <small class="retries">${retries(step.retries)}</small>` : ""}</summary>
      ${step.description ? `<p>${esc(step.description)}</p>` : ""}
      <h4>Arguments</h4><pre>${json(step.arguments)}</pre>
      ${step.output !== null ? `<h4>Result${step.cached_from ? ` <small>of ${esc(step.cached_from)}, an earlier call alike</small>` : ""}</h4><pre>${json(step.output)}</pre>` : ""}
      ${step.error ? `<h4>Error</h4><pre class="error">${errorText(step.error)}</pre>` : ""}
      ${step.reason ? `<p><small>${esc(step.reason)}</small></p>` : ""}
      ${step.retry_at ? `<p><small>tried again at ${esc(when(step.retry_at))}</small></p>` : ""}
    </details>${retry}</li>`;
}

/** A run of succeeded steps, folded: opening it shows them. */
function runItem(run: StepRun): string {
  return `<li class="step succeeded run" data-run="${esc(run.first)}"><details data-run="${esc(run.first)}">
    <summary>${badge("succeeded", `${run.steps} succeeded steps`)} <strong>${esc(run.first)}</strong> to <strong>${esc(run.last)}</strong></summary></details></li>`;
}

/** How a call stands, from its step: the step's result is its latest call's. */
function callStatus(call: CallAt): string {
  if (!call.latest) return "earlier try";
  const status = call.step.step.status;
  return status === "succeeded" ? "completed" : status;
}

function callItem(call: CallAt, open: boolean, heard: RetryHeard[]): string {
  const step = call.step.step;
  const mine = call.latest;
  const tries = mine ? Math.max(step.retries, heard.length) : heard.length;
  const redactions = mine ? Object.values(step.redacted_by ?? {}).reduce((a, b) => a + b, 0) : 0;
  return `<li class="call-row" data-call-id="${esc(call.call_id)}"><details class="call" data-call="${esc(call.call_id)}" ${open ? "open" : ""}><summary>${badge(callStatus(call), callStatus(call))} ${esc(step.tool)} <small>step ${esc(step.id)}</small>
      ${mine && step.duration_ms !== null ? `<small>${Number(step.duration_ms).toFixed(0)} ms</small>` : ""}
      ${tries ? badge("warning", retries(tries)) : ""}${mine && step.cached_from ? badge("cached", `result of ${step.cached_from}`) : ""}${redactions ? badge("warning", `${redactions} redacted`) : ""}</summary>
    ${open ? callDetail(call, heard) : ""}
  </details></li>`;
}

/** What an opened call shows: drawn only when open, so a closed row stays small. */
function callDetail(call: CallAt, heard: RetryHeard[]): string {
  const step = call.step.step;
  if (!call.latest) return `<p><small>An earlier try of step ${esc(step.id)}; its latest call is further on.</small></p>`;
  return `<h4>Input</h4><pre>${json(step.arguments)}</pre>
    ${step.output !== null ? `<h4>Output</h4><pre>${json(step.output)}</pre>` : ""}
    ${step.error ? `<h4>Error</h4><pre class="error">${errorText(step.error)}</pre>` : ""}
    ${heard.map((r) => `<h4>Try ${r.attempt} failed, tried again after ${r.retry_in_s.toFixed(1)} s</h4><pre class="error">${errorText(r.error)}</pre>`).join("")}`;
}

/** Sets a select's options to `values` (after its first, "any"), keeping what is chosen. */
function offerChoices(select: HTMLSelectElement, values: string[]): void {
  const chosen = select.value;
  const wanted = ["", ...new Set([...values, ...(chosen ? [chosen] : [])])];
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") === wanted.join("\n")) return;
  select.innerHTML = wanted.map((v) => `<option value="${esc(v)}">${v ? esc(v) : "any"}</option>`).join("");
  select.value = chosen;
}

function standingGrant(a: Approval): string {
  const where = a.similar_where ? ` · only where ${compact(a.similar_where)}` : "";
  return `<p class="grant">${badge("granted", "standing grant")} ${esc(a.tool ?? "")} calls like ${esc(a.request_id)}:
    ${a.similar_used} of ${a.similar_limit} used${a.similar_until ? ` · until ${esc(when(a.similar_until))}` : ""}${where}</p>`;
}

const NEED_KINDS: Record<PermissionNeed["kind"], string> = { tool: "permission", network: "network host", path: "path" };

function needsList(a: Approval): string {
  return `<ul class="needs">${a.permissions.map((n) => `<li><strong>${esc(NEED_KINDS[n.kind])} ${esc(n.name)}</strong> <small>${esc(n.reason)}</small></li>`).join("")}</ul>`;
}

function permissionGrant(a: Approval): string {
  const what = a.permissions.map((n) => `${n.kind} ${n.name}`).join(", ");
  const scope = a.grant_scope === "step" ? `step ${a.step_id}` : "the session";
  const ended = a.grant_until !== null && new Date(a.grant_until) <= new Date();
  return `<p class="grant">${badge(ended ? "paused" : "granted", ended ? "permission ended" : "permission granted")} ${esc(what)} for ${esc(scope)}${a.grant_until ? ` · until ${esc(when(a.grant_until))}` : ""}</p>`;
}

/** A permission request: granted as asked, for the step or the session, for a while. */
function permissionForm(a: Approval): string {
  return `<form class="approval" data-request="${esc(a.request_id)}" aria-label="Permission request ${esc(a.request_id)}">
    <h2>Permission requested ${badge(a.risk, a.risk)}</h2>
    <p>Step ${esc(a.step_id)}: ${esc(a.tool)} needs</p>
    ${needsList(a)}
    <p><small>may decide: ${esc(a.approver_roles.join(", "))} · expires ${esc(when(a.expires_at))}</small></p>
    ${a.arguments ? `<h3>Arguments</h3><pre>${json(a.arguments)}</pre>` : ""}
    <label>Grant for <select name="grant_scope">
      <option value="step" selected>this step only</option><option value="session">the whole session</option>
    </select></label>
    <label>until <select name="grant_for" aria-label="Grant until">
      <option value="15">15 minutes from now</option><option value="60" selected>an hour from now</option><option value="240">4 hours from now</option><option value="1440">a day from now</option>
    </select></label>
    <label>Comment <input name="comment" autocomplete="off"></label>
    <button type="button" data-action="grant" class="primary">Grant</button>
    <button type="button" data-action="deny" class="danger">Deny</button>
  </form>`;
}

/** The untrusted results a waiting call (or plan) may owe something to, each with the span to
 * read first: where its arguments came from, or the passage flagged as a suspected injection. */
function taintSources(a: Approval): string {
  if (!a.taint?.sources.length) return "";
  const items = a.taint.sources.map((s) => {
    const said = [
      s.arguments.length ? `${s.arguments.join(", ")} found in its result` : "",
      s.injection_suspected ? `flagged as a suspected injection${s.cues.length ? ` (${s.cues.join(", ")})` : ""}` : "",
    ].filter(Boolean);
    const mark = s.injection_suspected ? badge("failed", "suspected injection") : badge("waiting", "untrusted");
    return `<li data-source="${esc(s.call_id)}">${mark} step ${esc(s.step_id)}, ${esc(s.tool)}${said.length ? `: ${esc(said.join("; "))}` : ""}
      ${s.excerpt ? `<blockquote>${esc(s.excerpt)}</blockquote>` : ""}</li>`;
  });
  return `<section class="taint" aria-label="Untrusted sources"><h3>Read first: untrusted content behind this</h3><ul>${items.join("")}</ul></section>`;
}

function approvalForm(a: Approval): string {
  if (a.permissions.length) return permissionForm(a);
  const args = a.arguments ? JSON.stringify(a.arguments, null, 2) : "";
  return `<form class="approval" data-request="${esc(a.request_id)}" aria-label="Approval ${esc(a.request_id)}">
    <h2>Waiting for approval ${badge(a.risk, a.risk)}</h2>
    <p>${esc(a.scope === "plan" ? "The plan" : `Step ${a.step_id}: ${a.tool}`)} — ${esc(a.reason)}</p>
    ${taintSources(a)}
    <p><small>may decide: ${esc(a.approver_roles.join(", "))} · expires ${esc(when(a.expires_at))}</small></p>
    ${a.arguments ? `<label>Arguments (edit to approve with changes)<textarea name="arguments" rows="${Math.min(12, args.split("\n").length + 1)}">${esc(args)}</textarea></label>` : ""}
    ${a.scope === "step" ? `<label>Also approve the next <input name="similar" type="number" min="0" max="1000" step="1" value="0" inputmode="numeric"> similar calls (same tool, same rule)</label>
    <label>for <select name="similar_for" aria-label="Similar calls approved for">
      <option value="15">15 minutes</option><option value="60" selected>an hour</option><option value="240">4 hours</option><option value="1440">a day</option>
    </select></label>
    <label>only where <input name="similar_where" autocomplete="off" placeholder="path=build/** or command~^make test"></label>` : ""}
    <label>Comment <input name="comment" autocomplete="off"></label>
    <button type="button" data-action="grant" class="primary">Approve</button>
    <button type="button" data-action="deny" class="danger">Deny</button>
  </form>`;
}

// ---- routing -----------------------------------------------------------------------------

/** The header's links say which page is open. */
function markPlace(): void {
  for (const link of document.querySelectorAll<HTMLAnchorElement>("header nav a")) {
    const page = ["#/fleet", "#/mcp"].includes(location.hash) ? location.hash : "#/";
    const here = link.getAttribute("href") === page;
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function fail(error: unknown): void {
  if (error instanceof Unauthorized) {
    keepKey(null);
    signIn("That API key was refused; paste another.");
    return;
  }
  main.insertAdjacentHTML("afterbegin", `<p class="error" role="alert">${esc(error instanceof Error ? error.message : error)}</p>`);
}

async function route(): Promise<void> {
  const navigation = ++navigations;
  const current: Current = () => navigation === navigations;
  const fragmentKey = /^#key=(.+)$/.exec(location.hash);
  if (fragmentKey) {
    keepKey(decodeURIComponent(fragmentKey[1]));
    history.replaceState(null, "", `${location.pathname}#/`); // The key leaves the address bar.
  }
  teardown?.();
  teardown = null;
  if (!storedKey()) return signIn();
  // Busy until the view's first draw: assistive technology waits for it, and so can tests
  // (a view below the lists is drawn once scrolled to, which only counts once they are).
  main.setAttribute("aria-busy", "true");
  try {
    const me = await api<Me>("/me");
    if (!current()) return;
    who.textContent = `${me.id} · ${me.tenant} · ${me.roles.join(", ")}`;
    const session = /^#\/sessions\/([\w-]+)$/.exec(location.hash);
    markPlace();
    if (session) await sessionView(session[1], current);
    else if (location.hash === "#/fleet") {
      const stop = await fleetView(main, { follow, fail, current });
      if (current()) teardown = stop;
      else stop();
    } else if (location.hash === "#/mcp") {
      const stop = await mcpView(main, { follow, fail, current, admin: me.roles.includes("admin") });
      if (current()) teardown = stop;
      else stop();
    } else await sessionList(current);
  } catch (error) {
    fail(error);
  } finally {
    if (current()) main.setAttribute("aria-busy", "false");
  }
}

document.addEventListener("keydown", (event) => {
  const target = event.target as HTMLElement;
  if (["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) || event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.key === "Escape" && location.hash.startsWith("#/sessions/") && !confirmDialog.open) {
    location.hash = "#/";
    return;
  }
  if (event.key === "j" || event.key === "k") {
    const links = [...document.querySelectorAll<HTMLAnchorElement>(".session-link")];
    if (!links.length) return;
    const at = links.indexOf(document.activeElement as HTMLAnchorElement);
    const next = event.key === "j" ? Math.min(at + 1, links.length - 1) : Math.max(at - 1, 0);
    links[next].focus();
    event.preventDefault();
  }
});

// In-page links (skip links) move focus without touching the address, which routes.
document.addEventListener("click", (event) => {
  const link = (event.target as HTMLElement).closest<HTMLAnchorElement>("a[data-skip]");
  const target = link && document.getElementById(link.dataset.skip!);
  if (!target) return;
  event.preventDefault();
  if (!target.hasAttribute("tabindex")) target.tabIndex = -1;
  target.focus();
  target.scrollIntoView({ block: "start" });
});

window.addEventListener("hashchange", () => void route());
// A stream can stay open for a while after the network is gone; the browser knows sooner.
window.addEventListener("offline", () => feed?.interrupt());
void route();
