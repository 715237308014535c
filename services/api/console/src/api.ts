// Talking to the Helmline API: JSON requests with the key, and live events over SSE.
//
// EventSource cannot send an Authorization header, so the event stream is read with fetch;
// on any loss it reconnects with Last-Event-ID = the last stream sequence seen, and the API
// continues exactly after it.

import type { CloudEvent } from "./types";

const KEY_STORAGE = "helmline.apiKey";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
  ) {
    super(detail);
  }
}

export function storedKey(): string | null {
  return localStorage.getItem(KEY_STORAGE);
}

export function keepKey(key: string | null): void {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

export async function api<T>(path: string, init: { method?: string; body?: unknown } = {}): Promise<T> {
  const response = await fetch(path, {
    method: init.method ?? "GET",
    headers: {
      Authorization: `Bearer ${storedKey() ?? ""}`,
      ...(init.body !== undefined ? { "Content-Type": "application/json" } : {}),
    },
    body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
  });
  if (response.status === 401) throw new Unauthorized("the API key was refused");
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail ?? detail;
    } catch {
      // Not a problem document: the status text says enough.
    }
    throw new ApiError(response.status, detail);
  }
  return (await response.json()) as T;
}

/** Null for a resource the API has not (a session not yet stored, say). */
export function missing(error: unknown): null {
  if (error instanceof ApiError && error.status === 404) return null;
  throw error;
}

export type Connection = "connecting" | "live" | "reconnecting";

export interface StreamEvent {
  seq: number;
  type: string;
  /** The event as stored: CloudEvents JSON. */
  data: CloudEvent & { sessionid: string; causationid?: string };
}

/** What the API answers a command with: its event is in the log. */
export interface Accepted {
  session_id: string;
  seq: number;
  event_id: string;
}

/** What the API answers a rollback with: also the id its progress goes by. */
export interface RollbackAccepted extends Accepted {
  rollback_id: string;
}

/** Follows an SSE path until stopped, reconnecting after any loss without gaps. */
export class EventFeed {
  private controller = new AbortController();
  private lastId: number | null = null;
  private stopped = false;

  constructor(
    private readonly path: string,
    private readonly onEvent: (event: StreamEvent) => void,
    private readonly onConnection: (state: Connection) => void,
  ) {
    void this.run();
  }

  stop(): void {
    this.stopped = true;
    this.controller.abort();
  }

  /** Drop the current connection (the browser went offline): reconnect as after any loss. */
  interrupt(): void {
    this.controller.abort();
  }

  private async run(): Promise<void> {
    let pause = 250;
    this.onConnection("connecting");
    while (!this.stopped) {
      try {
        await this.readOnce(() => {
          pause = 250;
          this.onConnection("live");
        });
      } catch (error) {
        if (this.stopped) return;
        if (error instanceof Unauthorized) throw error;
      }
      if (this.stopped) return;
      this.onConnection("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, pause));
      pause = Math.min(pause * 2, 5000);
    }
  }

  private async readOnce(opened: () => void): Promise<void> {
    this.controller = new AbortController();
    const headers: Record<string, string> = { Authorization: `Bearer ${storedKey() ?? ""}` };
    if (this.lastId !== null) headers["Last-Event-ID"] = String(this.lastId);
    const response = await fetch(this.path, { headers, signal: this.controller.signal });
    if (response.status === 401) throw new Unauthorized("the API key was refused");
    if (!response.ok || !response.body) throw new ApiError(response.status, response.statusText);
    opened();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end: number;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        this.frame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  }

  private frame(text: string): void {
    const fields: Record<string, string> = {};
    for (const line of text.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(": ");
      if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 2);
    }
    if (fields.id === undefined || fields.data === undefined) return;
    const seq = Number(fields.id);
    this.lastId = seq;
    this.onEvent({ seq, type: fields.event ?? "", data: JSON.parse(fields.data) });
  }
}
