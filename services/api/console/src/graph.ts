// The plan as a graph: layers of steps (those of a layer wait for nothing in it, so they may
// run in parallel), the dependencies between them, the current step, each step's status.
//
// The API answers a window of layers around one step, a few steps a layer, and counts for
// the rest, so a plan of 10,000 steps draws as few nodes as one of ten. Drawn as SVG here
// (a layered layout is a few lines when the layers come with the data; no library needed).
// The graph is one tab stop: the arrow keys move between nodes, Enter shows the step.

import { api } from "./api";
import type { GraphNode, PlanGraph } from "./types";
import { counts, esc, onToolbar, toolbar } from "./ui";

const W = 156;
const H = 44;
const GAP_X = 18;
const GAP_Y = 58;
const LABEL = 20;
const PAD = 6;

export interface GraphOptions {
  box: HTMLElement;
  sessionId: string;
  /** Enter on a node: show the step. */
  onPick: (stepId: string) => void;
  onError: (error: unknown) => void;
  /** The plan as it was after this sequence (time travel); now when absent. */
  atSeq?: () => number | null;
  label?: string;
}

export class PlanGraphView {
  private graph: PlanGraph | null = null;
  /** Where a person moved the window: to a step, or to a layer; null follows the session. */
  private where: { focus: string } | { layer: number } | null = null;
  /** Requests made: only the answer to the latest is drawn. A read begun when the view came
   * on screen may answer after a person's move asked later, and would draw the window back. */
  private asked = 0;
  /** A person moved the window: the node drawn active takes the focus, from whichever
   * answer is drawn next. */
  private focusWanted = false;
  private active: string | null = null;
  private positions = new Map<string, { x: number; y: number; layer: number }>();

  constructor(private readonly options: GraphOptions) {
    options.box.innerHTML = `
      ${toolbar("graph", [["earlier", "Earlier layers"], ["later", "Later layers"], ["current", "Current step"]])}
      <p class="hint graph-facts"></p>
      <div class="graph-scroll"></div>`;
    onToolbar(options.box, "graph", (how) => void this.move(how));
    options.box.addEventListener("click", (event) => {
      const node = (event.target as Element).closest<SVGGElement>("g.node");
      if (node) this.pick(node.dataset.node!);
    });
    options.box.addEventListener("keydown", (event) => this.key(event));
  }

  /** Centre on a step (a person went to it elsewhere: the focus stays where it is). */
  centre(stepId: string): Promise<void> {
    this.where = { focus: stepId };
    this.active = stepId;
    return this.load(false);
  }

  /** Read the window again (the session moved on). */
  refresh(): Promise<void> {
    return this.load(false);
  }

  private move(how: string): Promise<void> {
    const g = this.graph;
    if (!g) return Promise.resolve();
    if (how === "current") {
      this.where = null;
      this.active = g.current;
      return this.load(true);
    }
    // The first (or last) step drawn in the layer a window further on. The window is set
    // before it is read: a read made meanwhile asks for it too.
    const span = g.layers.length;
    const target = how === "earlier" ? g.first_layer - span : g.first_layer + 2 * span - 1;
    this.where = { layer: Math.max(0, Math.min(g.layers_total - 1, target)) };
    this.active = null;
    return this.load(true);
  }

  private path(): string {
    const query = new URLSearchParams({ layers: "7", per_layer: "10" });
    if (this.where && "focus" in this.where) query.set("focus", this.where.focus);
    if (this.where && "layer" in this.where) query.set("layer", String(this.where.layer));
    const at = this.options.atSeq?.();
    if (at) query.set("at_seq", String(at));
    return `/sessions/${this.options.sessionId}/graph?${query}`;
  }

  private async load(focus: boolean): Promise<void> {
    const ticket = ++this.asked;
    this.focusWanted ||= focus;
    try {
      const answer = await api<PlanGraph>(this.path());
      if (ticket !== this.asked) return; // A later request's answer is drawn instead.
      this.show(answer, this.focusWanted);
      this.focusWanted = false;
    } catch (error) {
      if (ticket === this.asked) this.focusWanted = false;
      this.options.onError(error);
    }
  }

  private show(g: PlanGraph, focus: boolean): void {
    this.graph = g;
    const box = this.options.box;
    const scroll = box.querySelector<HTMLElement>(".graph-scroll")!;
    const facts = box.querySelector<HTMLElement>(".graph-facts")!;
    const last = g.first_layer + g.layers.length;
    (box.querySelector('[data-graph="earlier"]') as HTMLButtonElement).disabled = g.first_layer === 0;
    (box.querySelector('[data-graph="later"]') as HTMLButtonElement).disabled = last >= g.layers_total;
    if (!g.nodes.length) {
      facts.textContent = "";
      scroll.innerHTML = `<p class="hint">No plan yet.</p>`;
      return;
    }
    const above = counts(g.before);
    const below = counts(g.after);
    facts.textContent = [
      `Layers ${g.first_layer + 1} to ${last} of ${g.layers_total} (${g.steps_total} steps)`,
      g.current ? `current step ${g.current}` : "",
      above ? `above: ${above}` : "",
      below ? `below: ${below}` : "",
    ]
      .filter(Boolean)
      .join(" · ");
    const hadFocus = box.contains(document.activeElement) && document.activeElement?.tagName === "g";
    scroll.innerHTML = this.svg(g);
    const ids = g.nodes.map((n) => n.id);
    if (!this.active || !ids.includes(this.active)) this.active = g.focus && ids.includes(g.focus) ? g.focus : ids[0];
    this.roving(focus || hadFocus);
  }

  private svg(g: PlanGraph): string {
    this.positions.clear();
    const rows = new Map<number, GraphNode[]>();
    for (const n of g.nodes) rows.set(n.layer, [...(rows.get(n.layer) ?? []), n]);
    const widest = Math.max(1, ...g.layers.map((l) => l.shown + (l.steps > l.shown ? 1 : 0)));
    const width = PAD * 2 + widest * (W + GAP_X) - GAP_X;
    const height = PAD * 2 + g.layers.length * (H + GAP_Y + LABEL) - GAP_Y;
    const parts: string[] = [];
    const edges: string[] = [];
    g.layers.forEach((layer, row) => {
      const y = PAD + row * (H + GAP_Y + LABEL) + LABEL;
      const parallel = layer.steps > 1 ? ` · ${layer.steps} may run in parallel` : "";
      parts.push(`<text class="layer" x="${PAD}" y="${y - 6}">layer ${layer.layer + 1}${parallel}</text>`);
      if (layer.steps > 1) parts.push(`<rect class="band" x="${PAD - 3}" y="${y - 3}" width="${width - 2 * PAD + 6}" height="${H + 6}" rx="8"/>`);
      const members = rows.get(layer.layer) ?? [];
      members.forEach((n, i) => this.positions.set(n.id, { x: PAD + i * (W + GAP_X), y, layer: layer.layer }));
      if (layer.steps > layer.shown) {
        const x = PAD + members.length * (W + GAP_X);
        const hidden = { ...layer.by_status };
        for (const n of members) hidden[n.status] -= 1;
        parts.push(`<g class="more" transform="translate(${x},${y})"><rect width="${W}" height="${H}" rx="6"/>
          <text x="8" y="17">+${layer.steps - layer.shown} more</text><text x="8" y="34" class="meta">${esc(short(counts(hidden), 24))}</text></g>`);
      }
    });
    for (const n of g.nodes) {
      const to = this.positions.get(n.id)!;
      for (const d of n.depends_on) {
        const from = this.positions.get(d);
        if (!from) continue;
        const x1 = from.x + W / 2;
        const y1 = from.y + H;
        const x2 = to.x + W / 2;
        const y2 = to.y;
        const bend = (y2 - y1) / 2;
        edges.push(`<path class="edge" d="M${x1},${y1} C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}"/>`);
      }
      const current = n.id === g.current;
      const waits = n.depends_on.length + n.hidden_depends_on;
      // The name starts with what the node shows, in its order (as speech input expects).
      const shown = [short(n.id, 18), current ? "current" : "", short(`${n.tool} · ${n.status}`, 22), n.hidden_depends_on ? `↑${n.hidden_depends_on}` : ""];
      const label = `${shown.filter(Boolean).join(" ")}${waits ? `, waits for ${waits} step${waits > 1 ? "s" : ""}` : ""}`;
      parts.push(`<g class="node st-${esc(n.status)}${current ? " current" : ""}" data-node="${esc(n.id)}" role="button" tabindex="-1"
          aria-label="${esc(label)}" transform="translate(${to.x},${to.y})">
        <rect width="${W}" height="${H}" rx="6"/>
        <text x="8" y="17" class="id">${esc(shown[0])}${current ? ' <tspan class="now">current</tspan>' : ""}</text>
        <text x="8" y="34" class="meta">${esc(shown[2])}</text>
        ${n.hidden_depends_on ? `<text x="${W - 6}" y="34" class="hidden-deps" text-anchor="end">${esc(shown[3])}</text>` : ""}
      </g>`);
    }
    const name = this.options.label ?? "Plan graph";
    return `<svg class="plan-graph" role="group" aria-label="${esc(name)}: layers ${g.first_layer + 1} to ${g.first_layer + g.layers.length} of ${g.layers_total}"
      width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">
      <g aria-hidden="true">${edges.join("")}</g>${parts.join("")}</svg>`;
  }

  private nodes(): SVGGElement[] {
    return [...this.options.box.querySelectorAll<SVGGElement>("g.node")];
  }

  private roving(focus: boolean): void {
    for (const node of this.nodes()) {
      const mine = node.dataset.node === this.active;
      node.tabIndex = mine ? 0 : -1;
      if (mine && focus) {
        node.focus({ preventScroll: true });
        node.scrollIntoView({ block: "nearest", inline: "nearest" });
      }
    }
  }

  private pick(stepId: string): void {
    this.active = stepId;
    this.roving(false);
    this.options.onPick(stepId);
  }

  private key(event: KeyboardEvent): void {
    const node = (event.target as Element).closest<SVGGElement>("g.node");
    if (!node || !this.graph) return;
    const here = this.positions.get(node.dataset.node!);
    if (!here) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      this.pick(node.dataset.node!);
      return;
    }
    const all = [...this.positions.entries()];
    let next: string | undefined;
    if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      const row = all.filter(([, p]) => p.layer === here.layer).sort((a, b) => a[1].x - b[1].x);
      const at = row.findIndex(([id]) => id === node.dataset.node);
      next = row[at + (event.key === "ArrowLeft" ? -1 : 1)]?.[0];
    } else if (event.key === "ArrowUp" || event.key === "ArrowDown") {
      const layers = [...new Set(all.map(([, p]) => p.layer))].sort((a, b) => a - b);
      const to = layers[layers.indexOf(here.layer) + (event.key === "ArrowUp" ? -1 : 1)];
      const row = all.filter(([, p]) => p.layer === to);
      next = row.sort((a, b) => Math.abs(a[1].x - here.x) - Math.abs(b[1].x - here.x))[0]?.[0];
    } else return;
    event.preventDefault();
    if (!next) return;
    this.active = next;
    this.roving(true);
  }
}

function short(text: string, most: number): string {
  return text.length > most ? `${text.slice(0, most - 1)}…` : text;
}
