// The MCP page: every federated server as the gateway last published it (transport, health,
// breaker, the tenant's calls and errors of the last minute), its tools with their pinned
// definitions, a change that holds one (the diff, and for admins the button that accepts it),
// its resources and its prompts.
//
// Servers are gateway-wide, on the tools stream, which no feed of the API carries: the page
// reads `GET /mcp/servers` again every REREAD_MS, and at once (throttled) when a call of an
// MCP tool ends in the tenant's live events. Each server's parts are patched only where they
// changed, so a reason being typed into an accept form survives the re-reads.

import { api, type StreamEvent } from "./api";
import { badge, esc, throttle } from "./ui";
import { setHtml } from "./virtual";
import "./mcp.css";

// The shapes of `GET /mcp/servers` (see /openapi.json); only the fields the page shows.

interface McpResource {
  uri: string;
  name: string;
  description: string;
  mime_type: string | null;
}

interface McpPrompt {
  name: string;
  description: string;
  arguments: { name: string; description: string; required: boolean }[];
}

/** A server's registry entry (`ToolServerStatus`). */
interface ServerStatus {
  server: string;
  transport: string;
  available: boolean;
  error: string | null;
  tools: number;
  circuit: string;
  health: string;
  failures: number;
  resources: McpResource[];
  prompts: McpPrompt[];
  isolation: string;
}

interface McpTool {
  name: string;
  description: string;
  risk: string;
  effect: string;
  pinned_digest: string | null;
  held: boolean;
  change: { digest: string; changed: string[] } | null;
  diff: string | null;
}

interface McpServer {
  status: ServerStatus;
  /** Instances running now, for a server isolated per tenant or session; null if shared. */
  instances: number | null;
  calls_last_minute: number | null;
  errors_last_minute: number | null;
  tools: McpTool[];
}

interface McpServers {
  published: boolean;
  servers: McpServer[];
}

/** How often the servers are read again without a call heard. */
const REREAD_MS = 10_000;
/** Event types that end a call: an MCP tool's may move its server's figures. */
const CALL_ENDS = new Set(["tool.call.completed", "tool.call.failed"]);

/** Health words as badges: the colours the console gives the same kinds of state. */
const HEALTH_BADGE: Record<string, string> = { healthy: "succeeded", degraded: "warning", unresponsive: "failed", dead: "failed" };
const CIRCUIT_BADGE: Record<string, string> = { closed: "succeeded", half_open: "warning", open: "failed" };

/** A server's facts, in order; one that yields undefined is left out (a shared server's
 * instance count). A new fact of the registry is one line here. */
const FACTS: [label: string, value: (s: McpServer) => string | undefined][] = [
  ["Transport", (s) => esc(s.status.transport)],
  ["Isolation", (s) => esc(s.status.isolation)],
  ["Instances", (s) => (s.instances === null ? undefined : String(s.instances))],
  ["Health", (s) => badge(HEALTH_BADGE[s.status.health] ?? "", s.status.health)],
  ["Breaker", (s) => `${badge(CIRCUIT_BADGE[s.status.circuit] ?? "", s.status.circuit.replace("_", "-"))}${s.status.failures ? ` <small>${s.status.failures} failures in a row</small>` : ""}`],
  ["Calls / min", (s) => (s.calls_last_minute === null ? "—" : String(s.calls_last_minute))],
  ["Errors / min", (s) => (s.errors_last_minute === null ? "—" : String(s.errors_last_minute))],
  ["Tools", (s) => `${s.tools.length}${held(s) ? ` · ${badge("failed", `${held(s)} held`)}` : ""}`],
];

const held = (s: McpServer): number => s.tools.filter((t) => t.held).length;

export interface McpHooks {
  follow: (path: string, onEvent: (event: StreamEvent) => void) => void;
  fail: (error: unknown) => void;
  current: () => boolean;
  /** Whether the person may accept changed definitions (an admin). */
  admin: boolean;
}

export async function mcpView(main: HTMLElement, hooks: McpHooks): Promise<() => void> {
  main.innerHTML = `
    <section class="mcp">
      <h1>MCP servers</h1>
      <p class="hint">As the tool gateway last published them; calls and errors are your tenant's, over the last minute.</p>
      <p id="mcp-notice" role="status" aria-live="polite" tabindex="-1"></p>
      <div id="mcp-servers"><p><small>loading…</small></p></div>
    </section>`;
  const box = document.getElementById("mcp-servers") as HTMLElement;
  const notice = document.getElementById("mcp-notice") as HTMLElement;
  const render = async (): Promise<void> => {
    const read = await api<McpServers>("/mcp/servers");
    if (!hooks.current()) return;
    if (!read.servers.length) {
      setHtml(box, `<p class="empty">${read.published ? "The tool gateway federates no MCP server." : "No tool gateway has published its registry yet."}</p>`);
      return;
    }
    if (!box.querySelector(".mcp-server")) box.innerHTML = "";
    const shown = new Set<string>();
    for (const server of read.servers) {
      shown.add(server.status.server);
      patchServer(box, server, hooks.admin);
    }
    for (const gone of box.querySelectorAll<HTMLElement>(".mcp-server")) {
      if (!shown.has(gone.dataset.server!)) gone.remove();
    }
  };
  const refresh = throttle(render, hooks.fail);
  box.addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.target as HTMLFormElement;
    void accept(form, notice).then(refresh, hooks.fail);
  });
  await render();
  if (!hooks.current()) return () => {};
  hooks.follow("/events", (event) => {
    if (CALL_ENDS.has(event.type) && String(event.data.data.tool ?? "").includes("__")) refresh();
  });
  const ticking = window.setInterval(refresh, REREAD_MS);
  return () => window.clearInterval(ticking);
}

/** Draws a server's section, or patches the parts of it that changed. */
function patchServer(box: HTMLElement, server: McpServer, admin: boolean): void {
  const id = server.status.server;
  let section = box.querySelector<HTMLElement>(`.mcp-server[data-server="${CSS.escape(id)}"]`);
  if (!section) {
    const anchor = `mcp-${id}`;
    box.insertAdjacentHTML(
      "beforeend",
      `<section class="mcp-server" data-server="${esc(id)}" aria-labelledby="${esc(anchor)}-title">
        <h2 id="${esc(anchor)}-title">${esc(id)}</h2>
        <p class="mcp-error error"></p>
        <dl class="mcp-facts"></dl>
        <div class="mcp-tools"></div>
        <div class="mcp-offers"></div>
      </section>`,
    );
    section = box.lastElementChild as HTMLElement;
  }
  const s = server.status;
  setHtml(section.querySelector(".mcp-error")!, s.available ? "" : esc(`Unavailable: ${s.error ?? "not connected"}`));
  setHtml(
    section.querySelector(".mcp-facts")!,
    FACTS.map(([label, value]) => [label, value(server)] as const)
      .filter(([, value]) => value !== undefined)
      .map(([label, value]) => `<div><dt>${esc(label)}</dt> <dd>${value}</dd></div>`)
      .join(""),
  );
  setHtml(section.querySelector(".mcp-tools")!, toolsTable(server, admin));
  setHtml(section.querySelector(".mcp-offers")!, offers(s));
}

function toolsTable(server: McpServer, admin: boolean): string {
  if (!server.tools.length) return `<p class="hint">No tools listed.</p>`;
  const rows = server.tools.map((tool) => {
    const pin = tool.pinned_digest ? `<code title="${esc(tool.pinned_digest)}">${esc(tool.pinned_digest.slice(0, 12))}</code>` : `<small>not pinned</small>`;
    const state = tool.held ? badge("failed", "held: changed") : tool.pinned_digest ? badge("succeeded", "pinned") : "";
    return `<tr data-tool="${esc(tool.name)}">
      <td data-label="Tool"><code>${esc(tool.name)}</code><br><small>${esc(tool.description.split("\n")[0])}</small>${tool.held ? change(tool, admin) : ""}</td>
      <td data-label="Risk">${badge(tool.risk, tool.risk)}</td>
      <td data-label="Effect">${esc(tool.effect)}</td>
      <td data-label="Pin">${pin} ${state}</td>
    </tr>`;
  });
  return `<table class="mcp-tools-table">
    <caption>Tools of ${esc(server.status.server)}</caption>
    <thead><tr><th scope="col">Tool</th><th scope="col">Risk</th><th scope="col">Effect</th><th scope="col">Pin</th></tr></thead>
    <tbody>${rows.join("")}</tbody>
  </table>`;
}

/** A held tool's change: what changed, the diff, and for an admin the form that accepts it. */
function change(tool: McpTool, admin: boolean): string {
  const lines = (tool.diff ?? "").split("\n").map((line) => {
    const kind = line.startsWith("+") && !line.startsWith("+++") ? "added" : line.startsWith("-") && !line.startsWith("---") ? "removed" : "";
    return `<span class="${kind}">${esc(line)}</span>`;
  });
  const parts = tool.change?.changed.map((p) => p.replace("_", " ")).join(", ") ?? "";
  const form = admin
    ? `<form class="mcp-accept" data-tool="${esc(tool.name)}" data-digest="${esc(tool.change?.digest ?? "")}" aria-label="Accept the change of ${esc(tool.name)}">
        <label>Reason <input name="reason" autocomplete="off" maxlength="4096"></label>
        <button type="submit" class="primary">Accept change</button>
      </form>`
    : `<p class="hint">Its calls are refused until an admin accepts the change.</p>`;
  return `<details class="mcp-change" open>
      <summary>Changed since pinned: ${esc(parts)}</summary>
      <pre class="mcp-diff" tabindex="0" aria-label="Definition diff of ${esc(tool.name)}">${lines.join("\n")}</pre>
      ${form}
    </details>`;
}

function offers(s: ServerStatus): string {
  const resources = s.resources.length
    ? `<ul class="mcp-list">${s.resources
        .map((r) => `<li><code>${esc(r.uri)}</code> ${esc(r.name)}${r.mime_type ? ` <small>${esc(r.mime_type)}</small>` : ""}${r.description ? `<br><small>${esc(r.description)}</small>` : ""}</li>`)
        .join("")}</ul><p class="hint">Read as context with <code>${esc(s.server)}__read_resource</code>.</p>`
    : `<p class="hint">None listed.</p>`;
  const prompts = s.prompts.length
    ? `<ul class="mcp-list">${s.prompts
        .map((p) => `<li><code>${esc(p.name)}(${esc(p.arguments.map((a) => a.name + (a.required ? "" : "?")).join(", "))})</code>${p.description ? `<br><small>${esc(p.description)}</small>` : ""}</li>`)
        .join("")}</ul>`
    : `<p class="hint">None listed.</p>`;
  return `<div class="mcp-columns">
      <section aria-label="Resources of ${esc(s.server)}"><h3>Resources</h3>${resources}</section>
      <section aria-label="Prompts of ${esc(s.server)}"><h3>Prompts</h3>${prompts}</section>
    </div>`;
}

/** Accepts the change the form shows (only that digest: a newer one is refused), and says so. */
async function accept(form: HTMLFormElement, notice: HTMLElement): Promise<void> {
  const tool = form.dataset.tool!;
  const button = form.querySelector("button")!;
  button.disabled = true;
  try {
    const reason = (new FormData(form).get("reason") as string | null) ?? "";
    await api(`/tools/${encodeURIComponent(tool)}/accept`, { method: "POST", body: { digest: form.dataset.digest, reason } });
    notice.className = "";
    notice.textContent = `Accepted the change of ${tool}: its calls run again.`;
    notice.focus(); // The form goes with the change: the keyboard stays where the news is.
  } catch (error) {
    notice.className = "error";
    notice.textContent = `Not accepted: ${error instanceof Error ? error.message : String(error)}`;
    button.disabled = false;
  }
}
