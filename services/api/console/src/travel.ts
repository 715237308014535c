// Time travel: the session as it was after any sequence of its log. The API folds the log
// up to that point (`at_seq`); the page shows the overview then, and the plan graph then.

import { api } from "./api";
import { PlanGraphView } from "./graph";
import type { SessionOverview } from "./types";
import { badge, counts, esc, onToolbar, throttle, when } from "./ui";

export interface TravelOptions {
  box: HTMLElement;
  sessionId: string;
  onPick: (stepId: string) => void;
  onError: (error: unknown) => void;
  /** Whether the view is on screen: drawn only then (`wake` when it comes into view). */
  shown: () => boolean;
}

export class TimeTravel {
  private first = 0;
  private last = 0;
  private readonly slider: HTMLInputElement;
  private readonly graph: PlanGraphView;
  private readonly soon: () => void;

  constructor(private readonly options: TravelOptions) {
    options.box.innerHTML = `
      <form class="list-tools travel-tools" aria-label="Time travel">
        <label for="travel-seq">At sequence</label>
        <input type="range" id="travel-seq" min="0" max="0" step="1" aria-describedby="travel-at">
        <output id="travel-at" for="travel-seq"></output>
        <button type="button" data-travel="start">Start</button>
        <button type="button" data-travel="now">Now</button>
      </form>
      <div class="travel-then" aria-live="polite"></div>
      <div class="travel-graph graph"></div>`;
    this.slider = options.box.querySelector("#travel-seq")!;
    this.graph = new PlanGraphView({
      box: options.box.querySelector(".travel-graph")!,
      sessionId: options.sessionId,
      onPick: options.onPick,
      onError: options.onError,
      atSeq: () => this.at(),
      label: "The plan graph then",
    });
    // Twice a second at most: while it follows the session, the slider moves at each change.
    this.soon = throttle(() => this.draw(), options.onError, 500);
    this.slider.addEventListener("input", () => this.soon());
    onToolbar(options.box, "travel", (to) => this.go(to === "start" ? this.first : this.last));
  }

  /** The session's log runs from `first` to `last` now: the slider spans it. */
  async span(last: number): Promise<void> {
    if (!this.first) {
      const log = await api<{ items: { seq: number }[] }>(`/sessions/${this.options.sessionId}/log?limit=1`);
      this.first = log.items[0]?.seq ?? last;
      this.slider.min = String(this.first);
    }
    const following = !this.last || Number(this.slider.value) === this.last;
    this.last = last;
    this.slider.max = String(last);
    if (following && Number(this.slider.value) !== last) this.go(last);
  }

  /** Show the session after `seq` (and move the slider there). */
  go(seq: number): void {
    this.slider.value = String(seq);
    this.soon();
  }

  /** The sequence shown, or null at the session's last event: the API answers "now" from
   * the state it keeps, where a point in the past is folded from the log. */
  private at(): number | null {
    const seq = Number(this.slider.value);
    return seq && seq < this.last ? seq : null;
  }

  /** It came into view: draw what the slider says. */
  wake(): void {
    this.soon();
  }

  private async draw(): Promise<void> {
    const seq = Number(this.slider.value);
    if (!seq || !this.options.shown()) return;
    const at = this.at();
    const then = await api<SessionOverview>(`/sessions/${this.options.sessionId}/overview${at ? `?at_seq=${at}` : ""}`);
    const s = then.state;
    const box = this.options.box;
    box.querySelector("#travel-at")!.textContent = `#${seq}${seq === this.last ? " (now)" : ""}`;
    this.slider.setAttribute("aria-valuetext", `sequence ${seq}${seq === this.last ? ", now" : ""}`);
    const pending = Object.values(s.approvals).filter((a) => a.status === "pending");
    const thought = s.thoughts.at(-1);
    box.querySelector(".travel-then")!.innerHTML = `
      <p>${badge(s.status, s.status)} <small>${then.steps_by_status.succeeded ?? 0}/${then.steps_total} steps succeeded
        ${counts(then.steps_by_status) ? ` (${esc(counts(then.steps_by_status))})` : ""} · ${then.calls_total} calls ·
        ${then.checkpoints_total} checkpoints${s.started_at ? ` · started ${esc(when(s.started_at))}` : ""}</small></p>
      ${pending.length ? `<p>Waiting for: ${pending.map((a) => `${badge(a.risk, a.risk)} ${esc(a.tool ?? "the plan")}${a.step_id ? ` (step ${esc(a.step_id)})` : ""}`).join(", ")}</p>` : ""}
      ${thought ? `<p><small>Latest thought: ${esc(thought.text)}</small></p>` : ""}
      ${s.outcome ? `<p class="outcome">${esc(s.outcome)}</p>` : ""}`;
    await this.graph.refresh();
  }
}
