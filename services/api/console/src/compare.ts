// A fork beside its origin: where each stands, and what the fork took over from it.

import { api } from "./api";
import type { SessionOverview } from "./types";
import { badge, esc } from "./ui";

/** Draws the comparison of the fork `fork` with its origin in `box` (nothing for a session
 * that is no fork). */
export async function compareWithOrigin(box: HTMLElement, fork: SessionOverview): Promise<void> {
  const origin = fork.state.fork_of;
  if (!origin) {
    box.hidden = true;
    return;
  }
  const then = await api<SessionOverview>(`/sessions/${origin.session_id}/overview`);
  const row = (label: string, of: (o: SessionOverview) => string): string =>
    `<tr><th scope="row">${esc(label)}</th><td>${of(fork)}</td><td>${of(then)}</td></tr>`;
  const succeeded = (o: SessionOverview): string => `${o.steps_by_status.succeeded ?? 0}/${o.steps_total}`;
  const cost = (o: SessionOverview): string => (o.state.cost_usd ? `$${o.state.cost_usd.toFixed(4)}` : "–");
  box.hidden = false;
  box.querySelector(".compare")!.innerHTML = `
    <table class="usage"><caption>This fork and the session it started from</caption>
      <thead><tr><th scope="col"></th><th scope="col">this fork</th>
        <th scope="col"><a href="#/sessions/${esc(origin.session_id)}">origin</a></th></tr></thead>
      <tbody>
        ${row("status", (o) => badge(o.state.status, o.state.status))}
        ${row("steps succeeded", succeeded)}
        ${row("steps failed", (o) => String((o.steps_by_status.failed ?? 0) + (o.steps_by_status.denied ?? 0)))}
        ${row("tool calls", (o) => String(o.calls_total))}
        ${row("checkpoints", (o) => String(o.checkpoints_total))}
        ${row("model cost", cost)}
      </tbody></table>
    <p><small>Started from ${origin.checkpoint_id ? `checkpoint ${esc(origin.checkpoint_id)}` : "the origin's start"}${
      origin.completed_steps.length ? `, taking over ${esc(some(origin.completed_steps))} (not run again)` : ""
    }.</small></p>`;
}

/** The first few of a long list, and how many more. */
function some(items: string[], most = 12): string {
  const more = items.length - most;
  return more > 0 ? `${items.slice(0, most).join(", ")} and ${more} more` : items.join(", ");
}
