// The fleet: what runs, what waits for a person, and what failed in the last hour, live.
//
// Three reads of the session list (each a filter of `GET /sessions`), read again as events
// arrive, throttled as every live view: a flood from one session never holds back another
// that comes to wait meanwhile.

import { api, type StreamEvent } from "./api";
import { linesFromLogs, newestFirst } from "./lines";
import type { SessionSummary } from "./types";
import { badge, esc, throttle, when } from "./ui";
import { setHtml } from "./virtual";

const HOUR_MS = 3_600_000;
/** How long a session heard of but not on the page is read again for: the lists come from
 * a projection that trails the stream. */
const CATCH_UP_FOR_MS = 2_000;
/** As many as a part shows; more is said as a count. */
const SHOWN = 50;
/** At most how many sessions behind an event heard are read from their logs at once. */
const LINES_READ_AHEAD = 10;

interface Part {
  id: string;
  title: string;
  query: () => string;
  /** Whether a session's line, read from its log, belongs in the part (as `query` asks). */
  holds: (s: SessionSummary, now: number) => boolean;
  line: (s: SessionSummary) => string;
  empty: string;
}

const steps = (s: SessionSummary): string =>
  `${s.steps_succeeded}/${s.steps_total} steps${s.steps_failed ? ` · ${s.steps_failed} failed` : ""}`;

const PARTS: Part[] = [
  {
    id: "waiting",
    title: "Waiting for approval",
    query: () => "waiting=true",
    holds: (s) => s.waiting_for.length > 0,
    line: (s) =>
      `${s.waiting_for.map((w) => `${badge(w.risk, w.risk)} ${esc(w.tool ?? "the plan")}${w.step_id ? ` <small>step ${esc(w.step_id)}</small>` : ""}`).join("<br>")}
       <small>${steps(s)}</small>`,
    empty: "Nobody is waited for.",
  },
  {
    id: "running",
    title: "Running",
    query: () => "status=planning&status=executing&status=paused",
    holds: (s) => ["planning", "executing", "paused"].includes(s.status),
    line: (s) => `${badge(s.status, s.status)} <small>${steps(s)} · started ${esc(when(s.started_at))}</small>`,
    empty: "Nothing runs.",
  },
  {
    id: "failed",
    title: "Failed in the last hour",
    query: () => `status=failed&ended_after=${encodeURIComponent(new Date(Date.now() - HOUR_MS).toISOString())}`,
    holds: (s, now) => s.status === "failed" && s.ended_at !== null && now - Date.parse(s.ended_at) < HOUR_MS,
    line: (s) => `<small>${steps(s)} · ended ${esc(when(s.ended_at))}</small>${s.outcome ? `<br><small class="outcome">${esc(s.outcome)}</small>` : ""}`,
    empty: "No session failed in the last hour.",
  },
];

export interface FleetHooks {
  follow: (path: string, onEvent: (event: StreamEvent) => void) => void;
  fail: (error: unknown) => void;
  current: () => boolean;
}

export async function fleetView(main: HTMLElement, hooks: FleetHooks): Promise<() => void> {
  main.innerHTML = `
    <section class="fleet">
      <h1>Fleet</h1>
      <p id="fleet-news" role="status" aria-live="polite"></p>
      <p id="fleet-state" class="hint" role="status" aria-live="polite"></p>
      <div class="fleet-parts">
        ${PARTS.map(
          (p) => `<section class="fleet-part" id="fleet-${p.id}" aria-labelledby="fleet-${p.id}-title">
            <h2 id="fleet-${p.id}-title">${esc(p.title)} <span class="count" id="fleet-${p.id}-count"></span></h2>
            <ul class="fleet-list" id="fleet-${p.id}-list"><li class="empty"><small>loading…</small></li></ul>
          </section>`,
        ).join("")}
      </div>
    </section>`;
  const heard = new Map<string, { seq: number; at: number }>();
  let waitingWere: number | null = null;
  const render = async (): Promise<void> => {
    const answers = await Promise.all(PARTS.map((p) => api<SessionSummary[]>(`/sessions?${p.query()}&limit=${SHOWN + 1}`)));
    if (!hooks.current()) return;
    const listed = new Map<string, number>();
    for (const s of answers.flat()) listed.set(s.session_id, Math.max(listed.get(s.session_id) ?? 0, s.last_seq));
    // The parts come from a projection that trails a busy stream by seconds: a session
    // behind an event heard is read from its log, so one that comes to wait shows at once.
    const behindIds = [...heard]
      .filter(([id, { seq }]) => (listed.get(id) ?? 0) < seq)
      .sort((a, b) => b[1].seq - a[1].seq)
      .slice(0, LINES_READ_AHEAD)
      .map(([id]) => id);
    const fresh = await linesFromLogs(behindIds);
    if (!hooks.current()) return;
    const readAt = Date.now();
    for (const line of fresh) listed.set(line.session_id, Math.max(listed.get(line.session_id) ?? 0, line.last_seq));
    const parts = PARTS.map((part, i) => withLines(answers[i], fresh, (line) => part.holds(line, readAt)));
    PARTS.forEach((part, i) => {
      const sessions = parts[i];
      const list = document.getElementById(`fleet-${part.id}-list`);
      const count = document.getElementById(`fleet-${part.id}-count`);
      if (!list || !count) return;
      count.textContent = sessions.length > SHOWN ? `${SHOWN}+` : String(sessions.length);
      setHtml(
        list,
        sessions.length
          ? sessions
              .slice(0, SHOWN)
              .map((s) => `<li data-session="${esc(s.session_id)}"><a href="#/sessions/${esc(s.session_id)}" class="session-link">${esc(s.goal || s.session_id)}</a><br>${part.line(s)}</li>`)
              .join("")
          : `<li class="empty"><small>${esc(part.empty)}</small></li>`,
      );
    });
    // A line behind an event heard, or a session heard of lately that no part shows yet
    // (it may have just come to wait): read again.
    const now = performance.now();
    let behind = false;
    for (const [id, { seq, at }] of heard) {
      const line = listed.get(id);
      if (line !== undefined ? line < seq : now - at < CATCH_UP_FOR_MS) behind = true;
      else heard.delete(id);
    }
    const state = document.getElementById("fleet-state");
    if (state) state.textContent = behind ? "catching up with the live events…" : "";
    // Said (politely) when it changes: a new approval to decide is news, a redraw is not.
    const waiting = parts[0].length;
    const news = document.getElementById("fleet-news");
    if (news && waitingWere !== null && waiting !== waitingWere) news.textContent = `${waiting > SHOWN ? `${SHOWN}+` : waiting} waiting for approval.`;
    waitingWere = waiting;
    if (behind) refresh();
  };
  const refresh = throttle(render, hooks.fail);
  await render();
  if (!hooks.current()) return () => {};
  hooks.follow("/events", (event) => {
    heard.set(event.data.sessionid, { seq: event.seq, at: performance.now() });
    refresh();
  });
  // "The last hour" moves on without events.
  const ticking = window.setInterval(refresh, 30_000);
  return () => window.clearInterval(ticking);
}

/** A part's sessions as listed, with the lines read from sessions' logs put in (newer than
 * listed, and belonging) or taken out (no longer belonging). */
function withLines(listed: SessionSummary[], fresh: SessionSummary[], belongs: (line: SessionSummary) => boolean): SessionSummary[] {
  const byId = new Map(listed.map((s) => [s.session_id, s]));
  for (const line of fresh) {
    const known = byId.get(line.session_id);
    if (known && known.last_seq >= line.last_seq) continue;
    if (belongs(line)) byId.set(line.session_id, line);
    else byId.delete(line.session_id);
  }
  return newestFirst(byId.values());
}
