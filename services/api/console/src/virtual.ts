// A virtualised list: of a long list read by range from the API, only the rows on screen
// (and a few either side) are in the DOM, and only the pages they fall in are fetched.
//
// Rows may differ in height (an opened step shows its arguments and result): each is
// measured once drawn, and the rest are assumed `estimate` px. The list is one tab stop
// (roving focus): the arrow keys, Page Up/Down, Home and End move between rows, so a
// keyboard user never tabs through thousands of them.

export interface Page<T> {
  /** How many items the list has (those matching its filter). */
  total: number;
  items: T[];
}

export interface VirtualOptions<T> {
  /** The scrolling box; `list` (an ol or ul) is inside it. */
  box: HTMLElement;
  list: HTMLElement;
  /** Items `offset` to `offset + limit`, and how many there are. */
  fetch: (offset: number, limit: number) => Promise<Page<T>>;
  /** One `<li>` for the item. */
  render: (item: T) => string;
  /** Said in the list when it has no item. */
  empty: string;
  estimate?: number;
  pageSize?: number;
  /** The buttons and links in a row are tab stops only in the focused row: a row of
   * actions stays one tab stop away from the next part of the page. */
  roveControls?: boolean;
  onError?: (error: unknown) => void;
}

const OVERSCAN = 6;
/** What takes the focus in a row: its summary, else the row itself. */
const HANDLE = "summary";
/** What a row's controls are, when they rove with the focus. */
const CONTROLS = "button, a[href], input, select, textarea";

export class VirtualList<T> {
  private total = 0;
  private items = new Map<number, T>();
  private heights = new Map<number, number>();
  private loading = new Set<number>();
  private generation = 0;
  private active = 0;
  private focusWanted: number | null = null;
  private revealWanted: number | null = null;
  private frame: number | null = null;
  private drawn: { first: number; html: string[] } = { first: -1, html: [] };
  private readonly estimate: number;
  private readonly pageSize: number;

  constructor(private readonly options: VirtualOptions<T>) {
    this.estimate = options.estimate ?? 40;
    this.pageSize = options.pageSize ?? 100;
    options.box.addEventListener("scroll", () => this.schedule(), { passive: true });
    options.box.addEventListener("keydown", (event) => this.key(event));
    options.list.addEventListener("focusin", (event) => {
      const row = (event.target as HTMLElement).closest<HTMLElement>("li[data-index]");
      if (row) this.setActive(Number(row.dataset.index));
    });
  }

  get length(): number {
    return this.total;
  }

  /** The item at `index`, when it is loaded. */
  at(index: number): T | undefined {
    return this.items.get(index);
  }

  /** The list now has `total` items; those loaded stay. */
  setTotal(total: number): void {
    if (total === this.total) return;
    this.total = total;
    for (const index of this.items.keys()) if (index >= total) this.items.delete(index);
    this.active = Math.min(this.active, Math.max(0, total - 1));
    this.schedule();
  }

  /** The item at `index` changed: drawn again if on screen. */
  put(index: number, item: T): void {
    if (index >= this.total) this.total = index + 1;
    this.items.set(index, item);
    this.schedule();
  }

  /** Forget the items (what they are, or which are in the list, changed): the rows on
   * screen are read again. `total` when known, else the first page's answer tells it;
   * heights are kept unless `remeasure`. */
  reload(total?: number, remeasure = false): void {
    this.generation++;
    this.items.clear();
    this.loading.clear();
    if (remeasure) this.heights.clear();
    if (total !== undefined) this.total = total;
    else void this.load(0);
    this.schedule();
  }

  /** The items changed, not which are in the list (each tells of those after it, say):
   * the pages on screen are read again, their rows left as they are until the
   * answers come, so nothing flickers; the rest are forgotten, to be read when shown. */
  refresh(total: number): void {
    if (this.drawn.first < 0) {
      this.reload(total);
      return;
    }
    this.generation++;
    this.loading.clear();
    this.total = total;
    this.active = Math.min(this.active, Math.max(0, total - 1));
    const shown = new Set<number>();
    for (let i = this.drawn.first; i < this.drawn.first + this.drawn.html.length; i++) shown.add(Math.floor(i / this.pageSize));
    for (const index of this.items.keys()) if (index >= total || !shown.has(Math.floor(index / this.pageSize))) this.items.delete(index);
    for (const page of shown) if (page * this.pageSize < total) void this.load(page);
    this.schedule();
  }

  /** The row at `index`'s item, for a control in it. */
  itemOf(element: Element): T | undefined {
    const row = element.closest<HTMLElement>("li[data-index]");
    return row ? this.items.get(Number(row.dataset.index)) : undefined;
  }

  /** Show the row at `index` (and give it the focus). */
  scrollTo(index: number, focus = false): void {
    if (index < 0 || index >= this.total) return;
    this.setActive(index);
    // Brought into view by each draw until it is drawn: rows measured meanwhile, or its
    // page read, move where it lies.
    this.revealWanted = index;
    if (focus) this.focusWanted = index;
    this.draw();
  }

  private setActive(index: number): void {
    this.active = index;
    for (const row of this.options.list.querySelectorAll<HTMLElement>("li[data-index]")) this.rove(row, Number(row.dataset.index) === index);
  }

  /** Makes `row` the list's tab stop, or not. */
  private rove(row: HTMLElement, active: boolean): void {
    this.handle(row).tabIndex = active ? 0 : -1;
    for (const control of this.controls(row)) control.tabIndex = active ? 0 : -1;
  }

  private controls(row: Element): HTMLElement[] {
    return this.options.roveControls ? [...row.querySelectorAll<HTMLElement>(CONTROLS)] : [];
  }

  private handle(row: HTMLElement): HTMLElement {
    return row.querySelector<HTMLElement>(HANDLE) ?? row;
  }

  private key(event: KeyboardEvent): void {
    const target = event.target as HTMLElement;
    if (target !== this.options.box && !target.matches(`${HANDLE}, li[data-index]`)) return;
    const page = Math.max(1, Math.floor(this.options.box.clientHeight / this.estimate) - 1);
    const moves: Record<string, number> = {
      ArrowDown: this.active + 1,
      ArrowUp: this.active - 1,
      PageDown: this.active + page,
      PageUp: this.active - page,
      Home: 0,
      End: this.total - 1,
    };
    if (!(event.key in moves) || this.total === 0) return;
    event.preventDefault();
    this.scrollTo(Math.max(0, Math.min(this.total - 1, moves[event.key])), true);
  }

  /** Draw again (what a row shows changed without its item: opened, say). */
  redraw(): void {
    this.schedule();
  }

  private schedule(): void {
    if (this.frame === null) this.frame = requestAnimationFrame(() => this.draw());
  }

  /** Where each row starts, from the top of the list: `total + 1` numbers. */
  private offsets(): Float64Array {
    const offsets = new Float64Array(this.total + 1);
    for (let i = 0; i < this.total; i++) offsets[i + 1] = offsets[i] + (this.heights.get(i) ?? this.estimate);
    return offsets;
  }

  private draw(): void {
    if (this.frame !== null) cancelAnimationFrame(this.frame);
    this.frame = null;
    const { box, list } = this.options;
    if (!list.isConnected) return;
    if (this.total === 0) {
      this.drawn = { first: -1, html: [] };
      list.style.paddingTop = list.style.paddingBottom = "0px";
      list.innerHTML = this.options.empty;
      return;
    }
    const offsets = this.offsets();
    const seen = box.clientHeight || 600;
    let top = box.scrollTop;
    const reveal = this.revealWanted !== null && this.revealWanted < this.total ? this.revealWanted : null;
    if (reveal !== null && offsets[reveal] < top) top = offsets[reveal];
    else if (reveal !== null && offsets[reveal + 1] > top + seen) top = offsets[reveal + 1] - seen;
    const bottom = top + seen;
    let first = upperBound(offsets, top) - 1;
    let last = first;
    while (last < this.total - 1 && offsets[last + 1] < bottom) last++;
    first = Math.max(0, first - OVERSCAN);
    last = Math.min(this.total - 1, last + OVERSCAN);

    const html: string[] = [];
    const missing = new Set<number>();
    for (let i = first; i <= last; i++) {
      const item = this.items.get(i);
      if (item === undefined) {
        missing.add(Math.floor(i / this.pageSize));
        html.push(`<li class="placeholder" aria-busy="true"><small>loading…</small></li>`);
      } else html.push(this.options.render(item));
    }
    const hadFocus = list.contains(document.activeElement);
    // Which of its row's controls had the focus (-1: none), to give it back once drawn.
    const focusedControl = hadFocus ? this.controls(document.activeElement!.closest("li") ?? list).indexOf(document.activeElement as HTMLElement) : -1;
    list.style.paddingTop = `${offsets[first]}px`;
    list.style.paddingBottom = `${offsets[this.total] - offsets[last + 1]}px`;
    if (this.drawn.first === first && this.drawn.html.length === html.length) {
      // The same rows: only those whose markup changed are replaced.
      for (let i = 0; i < html.length; i++) if (html[i] !== this.drawn.html[i]) list.children[i].outerHTML = html[i];
    } else list.innerHTML = html.join("");
    this.drawn = { first, html };
    // Scrolled once the list has its new height: before, the box cut it to the old one's.
    if (top !== box.scrollTop) box.scrollTop = top;

    let moved = false;
    for (let i = 0; i < list.children.length; i++) {
      const row = list.children[i] as HTMLElement;
      const index = first + i;
      row.dataset.index = String(index);
      row.setAttribute("aria-posinset", String(index + 1));
      row.setAttribute("aria-setsize", String(this.total));
      this.rove(row, index === this.active);
      if (!row.classList.contains("placeholder")) {
        const height = row.offsetHeight + marginOf(row);
        if (Math.abs(height - (this.heights.get(index) ?? this.estimate)) > 0.5) moved = true;
        this.heights.set(index, height);
      }
    }
    const revealed = reveal === null ? null : list.children[reveal - first];
    if (reveal === null || (!moved && revealed && !revealed.classList.contains("placeholder"))) this.revealWanted = null;
    const wanted = this.focusWanted ?? (hadFocus ? this.active : null);
    const row = wanted === null ? null : list.querySelector<HTMLElement>(`li[data-index="${wanted}"]:not(.placeholder)`);
    if (row && this.focusWanted !== null) {
      // A row asked for is brought into view (its height may have differed from the guess
      // the scroll was set by).
      this.handle(row).focus();
      this.focusWanted = null;
    } else if (row && !row.contains(document.activeElement)) {
      // The row that had the focus was drawn again: the focus goes back where it was in it.
      (this.controls(row)[focusedControl] ?? this.handle(row)).focus({ preventScroll: true });
    }
    for (const page of missing) void this.load(page);
    if (moved) this.schedule();
  }

  private async load(page: number): Promise<void> {
    if (this.loading.has(page)) return;
    this.loading.add(page);
    const generation = this.generation;
    try {
      const answer = await this.options.fetch(page * this.pageSize, this.pageSize);
      if (generation !== this.generation) return;
      this.total = answer.total;
      answer.items.forEach((item, i) => this.items.set(page * this.pageSize + i, item));
      this.schedule();
    } catch (error) {
      this.options.onError?.(error);
    } finally {
      if (generation === this.generation) this.loading.delete(page);
    }
  }
}

/** The first index whose offset is above `value`. */
function upperBound(offsets: Float64Array, value: number): number {
  let low = 0;
  let high = offsets.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (offsets[middle] <= value) low = middle + 1;
    else high = middle;
  }
  return Math.max(1, low);
}

function marginOf(row: HTMLElement): number {
  const style = getComputedStyle(row);
  return parseFloat(style.marginTop) + parseFloat(style.marginBottom);
}

const drawnHtml = new WeakMap<HTMLElement, string>();

/** Sets an element's markup, unless it is that already (what is focused in it stays). */
export function setHtml(element: HTMLElement, html: string): void {
  if (drawnHtml.get(element) === html) return;
  drawnHtml.set(element, html);
  element.innerHTML = html;
}
