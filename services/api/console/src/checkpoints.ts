// The checkpoint timeline as a virtualised list, oldest first, read a page at a time
// (`GET /sessions/{id}/rollback-points`): each checkpoint says what a rollback to it would
// undo, as the API works it out from the session. It opens at the latest checkpoint, where
// rollbacks mostly go; Home reaches the oldest. A new checkpoint or a rollback changes what
// earlier rows say, so the rows on screen are read again then, not at every event.

import { api } from "./api";
import type { CheckpointAt, FileChanges, RangePage, SessionOverview } from "./types";
import { badge, esc, when } from "./ui";
import { VirtualList } from "./virtual";

export interface CheckpointTimelineOptions {
  box: HTMLElement;
  list: HTMLElement;
  sessionId: string;
  onError: (error: unknown) => void;
}

export class CheckpointTimeline {
  private readonly rows: VirtualList<CheckpointAt>;
  private started = false;
  /** What the rows on screen were read for: the checkpoints, rollbacks and undone steps. */
  private readFor = "";

  constructor(options: CheckpointTimelineOptions) {
    this.rows = new VirtualList<CheckpointAt>({
      box: options.box,
      list: options.list,
      fetch: (offset, limit) => api<RangePage<CheckpointAt>>(`/sessions/${options.sessionId}/rollback-points?offset=${offset}&limit=${limit}`),
      render: checkpointItem,
      empty: '<li class="empty"><small>No checkpoints yet.</small></li>',
      estimate: 64,
      pageSize: 50,
      roveControls: true,
      onError: options.onError,
    });
  }

  /** The session as the page now holds it. The first time, the rows around the latest
   * checkpoint are read; then the rows on screen are read again when what they say may
   * have changed. */
  follow(overview: SessionOverview): void {
    const rollbacks = Object.values(overview.state.rollbacks).map((r) => `${r.rollback_id}:${r.status}`);
    const lost = Object.keys(overview.state.unrestorable_snapshots).length;
    const readFor = `${overview.checkpoints_total}|${overview.steps_by_status.undone ?? 0}|${lost}|${rollbacks.join()}`;
    if (readFor === this.readFor) return;
    this.readFor = readFor;
    const total = overview.checkpoints_total;
    if (this.started) {
      this.rows.refresh(total);
      return;
    }
    this.started = true;
    this.rows.reload(total);
    this.rows.scrollTo(total - 1);
  }

  /** The checkpoint of the row `element` is in. */
  itemOf(element: Element): CheckpointAt | undefined {
    return this.rows.itemOf(element);
  }
}

/** Names the latest of `total` steps, and counts the rest. */
function named(steps: string[], total: number): string {
  return steps.join(", ") + (total > steps.length ? ` and ${(total - steps.length).toLocaleString("en")} more` : "");
}

function checkpointItem(at: CheckpointAt): string {
  const { checkpoint: c, rollback: r } = at;
  const locked = r.blocking > 0;
  const files = r.file_changes ? ` (${r.file_changes} file change${r.file_changes > 1 ? "s" : ""})` : "";
  const would = locked
    ? `a rollback here cannot pass ${named(r.blocking_steps, r.blocking)} (irreversible)`
    : r.steps
      ? `a rollback here undoes ${named(r.undoes.map((u) => u.step_id), r.steps)}${files}`
      : "nothing to undo after it";
  const lost = at.workspace_lost;
  return `<li class="checkpoint ${c.reversible ? "" : "irreversible"}" data-checkpoint="${esc(c.checkpoint_id)}">
    <span>${c.reversible ? "" : badge("irreversible", "irreversible")} after <strong>${esc(c.step_id)}</strong>
      <small>#${c.at_seq} · ${esc(when(c.created_at))}${c.compensation ? ` · ${esc(c.compensation)}` : ""}</small>
      ${c.changes ? filesChanged(c.changes) : ""}<small class="would-undo">${esc(would)}</small></span>
    ${at.step_status === "undone" ? badge("undone", "undone") : ""}${lost ? `<span title="${esc(lost)}">${badge("irreversible", "workspace not kept")}</span>` : ""}
    <button type="button" data-action="travel" data-seq="${c.at_seq}">Show the session here</button>
    <button type="button" data-action="rollback" data-checkpoint="${esc(c.checkpoint_id)}" ${locked || r.later === 0 ? "disabled" : ""}
      title="${locked ? `locked: ${esc(named(r.blocking_steps, r.blocking))} cannot be undone` : r.later === 0 ? "nothing after this point" : "roll back to here"}">
      ${locked ? "Locked" : "Roll back to here"}</button>
  </li>`;
}

/** What a step changed in the workspace: counts, and the paths on hover. */
function filesChanged(changes: FileChanges): string {
  const paths = [
    ...changes.created.map((p) => `+ ${p}`),
    ...changes.modified.map((p) => `~ ${p}`),
    ...changes.deleted.map((p) => `- ${p}`),
  ];
  const more = changes.unlisted ? ` and ${changes.unlisted} more` : "";
  const counts = `${changes.created.length} created, ${changes.modified.length} modified, ${changes.deleted.length} deleted${more}`;
  return `<small class="files" title="${esc(paths.join("\n"))}">files: ${paths.length || changes.unlisted ? counts : "none changed"}</small>`;
}
