// A session's log as a virtualised list, oldest first. It is read a page at a time by
// sequence (`GET /sessions/{id}/log?after_seq=N`) as the reader scrolls on, so the 30,000
// events of a 10,000-step session are never read whole; once read to its end, it grows
// from the events the page hears live, without asking the API again.

import { api, type StreamEvent } from "./api";
import type { EventPage, LoggedEvent } from "./types";
import { type Page, VirtualList } from "./virtual";
import { esc, json } from "./ui";

export interface EventLogOptions {
  box: HTMLElement;
  list: HTMLElement;
  sessionId: string;
  onError: (error: unknown) => void;
}

/** Payload fields that say what an event is about, shown in its row, with their labels. */
const ABOUT: [field: string, label: string][] = [
  ["step_id", "step"],
  ["tool", ""],
  ["call_id", "call"],
  ["request_id", "request"],
  ["checkpoint_id", "checkpoint"],
  ["kind", ""],
];
const TIME: Intl.DateTimeFormatOptions = { hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3, hour12: false };

export class EventLog {
  private readonly rows: VirtualList<LoggedEvent>;
  private readonly open = new Set<number>();
  /** Events read from the first on, with no gap. */
  private read = 0;
  /** Whether the log holds events after those read: one more row, "loading…", reads them. */
  private more = true;
  /** The latest sequence heard live. */
  private heardSeq = 0;
  private started = false;

  constructor(private readonly options: EventLogOptions) {
    this.rows = new VirtualList<LoggedEvent>({
      box: options.box,
      list: options.list,
      fetch: (offset, limit) => this.page(offset, limit),
      render: (logged) => eventItem(logged, this.open.has(logged.seq)),
      empty: '<li class="empty"><small>No events.</small></li>',
      estimate: 34,
      onError: options.onError,
    });
    // An opened row shows the whole event (a scrolling box the keys reach, for a long one):
    // drawn only then, so a closed row stays small.
    options.list.addEventListener("click", (event) => {
      const details = (event.target as HTMLElement).closest("summary")?.parentElement;
      if (!(details instanceof HTMLDetailsElement) || details.dataset.seq === undefined) return;
      event.preventDefault();
      const seq = Number(details.dataset.seq);
      if (!this.open.delete(seq)) this.open.add(seq);
      this.rows.redraw();
    });
  }

  /** Reads the first page (once the list comes on screen); later calls do nothing. */
  start(): void {
    if (this.started) return;
    this.started = true;
    this.rows.reload();
  }

  /** An event the page heard live: a row of its own once the list is read to its end;
   * before then, the row that reads on will bring it. */
  heard(event: StreamEvent): void {
    if (event.seq <= this.heardSeq) return;
    this.heardSeq = event.seq;
    if (!this.started || this.more || event.seq <= this.lastRead()) return;
    // The feed brings every event of the session in order: this one comes right after.
    this.rows.put(this.read, { seq: event.seq, event: { ...event.data, type: event.type } });
    this.read++;
  }

  private lastRead(): number {
    return this.read ? (this.rows.at(this.read - 1)?.seq ?? 0) : 0;
  }

  private async page(offset: number, limit: number): Promise<Page<LoggedEvent>> {
    // Rows are read on from the one before: the list grows only at its end, so it is read.
    const after = offset === 0 ? 0 : this.rows.at(offset - 1)?.seq;
    if (after === undefined) throw new Error(`the events before row ${offset} are not read yet`);
    const page = await api<EventPage>(`/sessions/${this.options.sessionId}/log?after_seq=${after}&limit=${limit}`);
    const end = offset + page.items.length;
    if (end >= this.read) {
      this.read = end;
      // An event heard while the page was read, and stored after it, is still to read.
      this.more = page.more || this.heardSeq > (page.items.at(-1)?.seq ?? after);
    }
    return { total: this.read + (this.more ? 1 : 0), items: page.items };
  }
}

function eventItem(logged: LoggedEvent, open: boolean): string {
  const { event, seq } = logged;
  const data = event.data ?? {};
  const about = ABOUT.filter(([field]) => typeof data[field] === "string").map(([field, label]) => ` <small>${label ? `${label} ` : ""}${esc(data[field])}</small>`);
  const time = new Date(event.time).toLocaleTimeString(undefined, TIME);
  return `<li class="event-row"><details class="event" data-seq="${seq}" ${open ? "open" : ""}>
    <summary><small>#${seq}</small> <strong>${esc(event.type)}</strong>${about.join("")} <small>${esc(time)}</small></summary>
    ${open ? `<pre tabindex="0">${json(data)}</pre>` : ""}</details></li>`;
}
