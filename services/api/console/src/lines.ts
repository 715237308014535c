// Session list lines read from each session's log: the lists come from a projection that
// trails a busy stream by seconds, and a session that comes to wait must show at once.

import { api, missing } from "./api";
import type { SessionSummary } from "./types";

/** The lines of these sessions as their logs have them; a session not stored yet is left out. */
export async function linesFromLogs(ids: string[]): Promise<SessionSummary[]> {
  const read = await Promise.all(ids.map((id) => api<SessionSummary>(`/sessions/${id}/summary`).catch(missing)));
  return read.filter((line): line is SessionSummary => line !== null);
}

/** When a line's session started; never started sorts last. */
export function startedAt(line: SessionSummary): number {
  return line.started_at ? Date.parse(line.started_at) : -Infinity;
}

/** Newest first, as the API lists sessions. */
export function newestFirst(lines: Iterable<SessionSummary>): SessionSummary[] {
  return [...lines].sort((a, b) => startedAt(b) - startedAt(a) || a.session_id.localeCompare(b.session_id));
}
