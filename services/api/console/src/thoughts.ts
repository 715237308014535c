// The planner's thoughts as a virtualised list, oldest first. The overview brings the latest
// ones as they are recorded, so a live session's new thoughts cost no read of their own;
// earlier ones are read a page at a time (`GET /sessions/{id}/thoughts`) when scrolled to.
// The list follows the newest while the reader is at its end, and not once they scroll up.

import { api } from "./api";
import type { RangePage, SessionOverview, Thought } from "./types";
import { badge, esc } from "./ui";
import { VirtualList } from "./virtual";

export interface ThoughtListOptions {
  box: HTMLElement;
  list: HTMLElement;
  sessionId: string;
  onError: (error: unknown) => void;
}

/** How close to the end of the box counts as at its end, in px. */
const AT_END_PX = 8;

export class ThoughtList {
  private readonly rows: VirtualList<Thought>;
  private total = -1;

  constructor(private readonly options: ThoughtListOptions) {
    this.rows = new VirtualList<Thought>({
      box: options.box,
      list: options.list,
      fetch: (offset, limit) => api<RangePage<Thought>>(`/sessions/${options.sessionId}/thoughts?offset=${offset}&limit=${limit}`),
      render: thoughtItem,
      empty: '<li class="empty"><small>No thoughts recorded.</small></li>',
      estimate: 28,
      onError: options.onError,
    });
  }

  /** The session as the page now holds it: its latest thoughts put in their rows. */
  follow(overview: SessionOverview): void {
    const total = overview.thoughts_total;
    if (total === this.total) return;
    const { box } = this.options;
    const atEnd = this.total < 0 || box.scrollHeight - box.scrollTop - box.clientHeight < AT_END_PX;
    this.total = total;
    const latest = overview.state.thoughts;
    this.rows.setTotal(total);
    latest.forEach((thought, i) => this.rows.put(total - latest.length + i, thought));
    if (atEnd) this.rows.scrollTo(total - 1);
  }
}

function thoughtItem(t: Thought): string {
  return `<li>${badge("thought", t.kind)} ${esc(t.text)}${t.confidence !== null ? ` <small>(${Math.round(t.confidence * 100)} %)</small>` : ""}</li>`;
}
