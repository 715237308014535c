// The tool-call timeline: a waterfall of a page of calls, each from when it was scheduled to
// when it finished, the time it waited for a person and the time it ran drawn apart, with its
// retries and its server; and the page's calls summed up by server.
//
// It shows the latest page and follows the session while it runs; earlier pages are read
// by range (the same `GET /sessions/{id}/calls` the call list reads).

import { api } from "./api";
import type { CallAt, RangePage } from "./types";
import { badge, duration, esc, onToolbar, toolbar } from "./ui";

const PAGE = 40;

export interface TimelineOptions {
  box: HTMLElement;
  sessionId: string;
  /** How many calls the session has made. */
  total: () => number;
  onError: (error: unknown) => void;
}

interface Timing {
  start: number;
  end: number;
  wait: number;
  run: number;
}

export class CallTimeline {
  /** The first call shown; null follows the latest. */
  private offset: number | null = null;

  constructor(private readonly options: TimelineOptions) {
    options.box.innerHTML = `
      ${toolbar("wf", [["earlier", "Earlier calls"], ["later", "Later calls"], ["latest", "Latest calls"]])}
      <p class="hint wf-facts"></p>
      <p class="hint wf-legend" aria-hidden="true"><span class="wf-key wf-span"></span> scheduled
        <span class="wf-key wf-wait"></span> waiting for a person <span class="wf-key wf-run"></span> running</p>
      <ul class="wf-servers" aria-label="Calls shown, by server"></ul>
      <ol class="waterfall" aria-label="Calls shown, in the order they were scheduled"></ol>`;
    onToolbar(options.box, "wf", (how) => {
      const first = this.first();
      this.offset = how === "latest" ? null : Math.max(0, first + (how === "earlier" ? -PAGE : PAGE));
      if (this.offset !== null && this.offset + PAGE >= options.total()) this.offset = null;
      void this.refresh();
    });
  }

  private first(): number {
    return this.offset ?? Math.max(0, this.options.total() - PAGE);
  }

  /** Read the page shown again (the session moved on). */
  async refresh(): Promise<void> {
    const first = this.first();
    try {
      const page = await api<RangePage<CallAt>>(`/sessions/${this.options.sessionId}/calls?offset=${first}&limit=${PAGE}`);
      this.show(page);
    } catch (error) {
      this.options.onError(error);
    }
  }

  private show(page: RangePage<CallAt>): void {
    const box = this.options.box;
    const last = page.offset + page.items.length;
    (box.querySelector('[data-wf="earlier"]') as HTMLButtonElement).disabled = page.offset === 0;
    (box.querySelector('[data-wf="later"]') as HTMLButtonElement).disabled = last >= page.total;
    (box.querySelector('[data-wf="latest"]') as HTMLButtonElement).disabled = this.offset === null;
    box.querySelector(".wf-facts")!.textContent = page.items.length ? `Calls ${page.offset + 1} to ${last} of ${page.total}` : "No tool calls yet.";
    const now = Date.now();
    const timings = page.items.map((call) => timing(call, now));
    const known = timings.filter((t): t is Timing => t !== null);
    const t0 = Math.min(...known.map((t) => t.start));
    const span = Math.max(1, Math.max(...known.map((t) => t.end)) - t0);
    const pct = (ms: number): string => `${((ms / span) * 100).toFixed(2)}%`;
    const rows = page.items.map((call, i) => {
      const t = timings[i];
      const step = call.step.step;
      const facts: string[] = [];
      let bars = "";
      if (t) {
        facts.push(`at +${duration((t.start - t0) / 1000)}`);
        if (t.wait) facts.push(`waited ${duration(t.wait / 1000)} for a person`);
        facts.push(step.duration_ms !== null ? `ran ${duration(t.run / 1000)}` : `${duration((t.end - t.start) / 1000)} so far`);
        const queued = Math.max(0, t.end - t.start - t.wait - t.run);
        bars = `<span class="wf-span" style="left:${pct(t.start - t0)};width:${pct(t.end - t.start)}"></span>
          ${t.wait ? `<span class="wf-wait" style="left:${pct(t.start - t0)};width:${pct(t.wait)}"></span>` : ""}
          <span class="wf-run" style="left:${pct(t.start - t0 + t.wait + queued)};width:${pct(t.run)}"></span>`;
      } else facts.push(call.latest ? "not started" : "an earlier try, failed");
      const tries = call.latest ? step.retries : 0;
      if (tries) facts.push(tries === 1 ? "1 retry" : `${tries} retries`);
      const status = call.latest ? (step.status === "succeeded" ? "completed" : step.status) : "earlier try";
      return `<li class="wf-row" data-call-id="${esc(call.call_id)}">
        <div class="wf-label">${badge(status, status)} <strong>${esc(step.tool)}</strong> <small>step ${esc(step.id)} · ${esc(call.step.server)}</small></div>
        <div class="wf-track" aria-hidden="true">${bars}</div>
        <small class="wf-said">${esc(facts.join(" · "))}</small></li>`;
    });
    box.querySelector(".waterfall")!.innerHTML = rows.join("");
    const servers = new Map<string, { calls: number; ran: number; waited: number; retries: number }>();
    page.items.forEach((call, i) => {
      const sum = servers.get(call.step.server) ?? { calls: 0, ran: 0, waited: 0, retries: 0 };
      sum.calls += 1;
      sum.ran += timings[i]?.run ?? 0;
      sum.waited += timings[i]?.wait ?? 0;
      sum.retries += call.latest ? call.step.step.retries : 0;
      servers.set(call.step.server, sum);
    });
    box.querySelector(".wf-servers")!.innerHTML = [...servers]
      .sort((a, b) => a[0].localeCompare(b[0]))
      .map(
        ([server, s]) =>
          `<li><strong>${esc(server)}</strong>: ${s.calls} call${s.calls > 1 ? "s" : ""} · ran ${esc(duration(s.ran / 1000))}${s.waited ? ` · waited ${esc(duration(s.waited / 1000))} for a person` : ""}${s.retries ? ` · ${s.retries} retr${s.retries > 1 ? "ies" : "y"}` : ""}</li>`,
      )
      .join("");
  }
}

/** When the call was scheduled and finished (now, if it has not), how long of that it
 * waited for a person, and how long it ran; null for an earlier try (its times are gone). */
function timing(call: CallAt, now: number): Timing | null {
  const step = call.step.step;
  if (!call.latest || !step.scheduled_at) return null;
  const start = Date.parse(step.scheduled_at);
  const end = Math.max(start, step.finished_at ? Date.parse(step.finished_at) : now);
  const wait = Math.min(end - start, call.step.approval_wait_ms ?? 0);
  const run = Math.min(end - start - wait, step.duration_ms ?? 0);
  return { start, end, wait, run };
}
