// Pieces every view shares: escaping, badges, times, and the live views' throttle.

const escapeMap: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function esc(value: unknown): string {
  return String(value ?? "").replace(/[&<>"']/g, (c) => escapeMap[c]);
}

/** A value as indented JSON, escaped for the page. */
export function json(value: unknown): string {
  return esc(JSON.stringify(value, null, 2));
}

export function badge(kind: string, text: string): string {
  return `<span class="badge ${esc(kind)}">${esc(text)}</span>`;
}

export function when(iso: string | null): string {
  return iso ? new Date(iso).toLocaleString() : "";
}

/** A span of time as people say it. */
export function duration(seconds: number): string {
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 90) return `${Number(seconds.toFixed(1))} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** Counts by status as text: "3 succeeded, 1 failed". */
export function counts(byStatus: Record<string, number>): string {
  return Object.entries(byStatus)
    .filter(([, n]) => n > 0)
    .map(([status, n]) => `${n} ${status}`)
    .join(", ");
}

/** How far behind its events a live view may fall while they keep coming. */
export const LIVE_EVERY_MS = 250;

/** A call of the function returned asks for `work` to run; a burst of calls is coalesced but
 * never starved. One run at a time: the first call after a quiet spell runs at once, and calls
 * that come while a run is due or under way make one more, begun no sooner than `every` ms
 * after the last began. A steady stream of events so gets a run every `every` ms (back to back
 * when a run takes longer), where a debounce waits for the stream to stop. Runs one at a time
 * also means two reads never answer out of order and leave the older one on the page. */
export function throttle(work: () => Promise<void>, onError: (error: unknown) => void, every = LIVE_EVERY_MS): () => void {
  let timer: number | undefined;
  let running = false;
  let again = false;
  let began = -Infinity;
  const run = async (): Promise<void> => {
    timer = undefined;
    running = true;
    again = false;
    began = performance.now();
    try {
      await work();
    } catch (error) {
      onError(error);
    } finally {
      running = false;
      if (again) schedule();
    }
  };
  const schedule = (): void => {
    if (running) again = true;
    else if (timer === undefined) timer = window.setTimeout(() => void run(), Math.max(0, began + every - performance.now()));
  };
  return schedule;
}

/** A row of buttons, each `data-NAME=KEY`: moving a window through a long list. */
export function toolbar(name: string, buttons: [key: string, label: string][]): string {
  return `<div class="graph-tools">${buttons.map(([key, label]) => `<button type="button" data-${name}="${key}">${esc(label)}</button>`).join("")}</div>`;
}

/** Calls `act` with the key of a `toolbar(name)` button clicked in `box`. */
export function onToolbar(box: HTMLElement, name: string, act: (key: string) => void): void {
  box.addEventListener("click", (event) => {
    const button = (event.target as HTMLElement).closest<HTMLButtonElement>(`button[data-${name}]`);
    if (button) act(button.dataset[name]!);
  });
}

/** Whether `element` is on screen, kept up to date from `start()` on;
 * `shown` runs each time it comes into view. Views below the fold are so drawn, and read
 * again while the session runs, only once someone scrolls to them. */
export function onScreen(element: HTMLElement, shown: () => void): { visible: () => boolean; start: () => void; stop: () => void } {
  let visible = false;
  const observer = new IntersectionObserver(
    (entries) => {
      const now = entries.some((entry) => entry.isIntersecting);
      if (now && !visible) shown();
      visible = now;
    },
    { rootMargin: "0px" },
  );
  return { visible: () => visible, start: () => observer.observe(element), stop: () => observer.disconnect() };
}
