// The shapes the API answers with (see /openapi.json); only the fields the console shows.

export interface WaitingFor {
  request_id: string;
  step_id: string | null;
  tool: string | null;
  risk: string;
}

export interface SessionSummary {
  session_id: string;
  status: string;
  goal: string;
  started_at: string | null;
  ended_at: string | null;
  steps_total: number;
  steps_succeeded: number;
  steps_failed: number;
  outcome: string;
  waiting_for: WaitingFor[];
  /** Stream sequence of the session's last event the line reflects. */
  last_seq: number;
}

export interface Step {
  id: string;
  description: string;
  tool: string;
  arguments: Record<string, unknown>;
  risk: string | null;
  requires_approval: boolean;
  estimated_duration_s: number | null;
  depends_on: string[];
  status: string;
  attempts: number;
  retries: number;
  output: unknown;
  /** The earlier call whose result the step's call reused (its tool is pure). */
  cached_from: string | null;
  error: { kind: string; message: string; suggestion: string | null } | null;
  reason: string | null;
  duration_ms: number | null;
  retry_at: string | null;
  /** When its latest attempt was scheduled, and finished. */
  scheduled_at: string | null;
  finished_at: string | null;
}

export interface Approval {
  request_id: string;
  scope: string;
  risk: string;
  reason: string;
  step_id: string | null;
  tool: string | null;
  arguments: Record<string, unknown> | null;
  status: string;
  expires_at: string;
  approver_roles: string[];
  comment: string;
  modified_arguments: Record<string, unknown> | null;
  similar_limit: number | null;
  similar_until: string | null;
  similar_where: Record<string, unknown> | null;
  similar_used: number;
  /** A permission request: what the call lacks; empty for other requests. */
  permissions: PermissionNeed[];
  /** A granted permission request: the step that asked, or the whole session. */
  grant_scope: "step" | "session" | null;
  grant_until: string | null;
  /** What untrusted content the call (or plan) may owe its existence or arguments to. */
  taint: CallTaint | null;
}

/** A result in the model's context that a proposed call may owe something to. */
export interface TaintSource {
  step_id: string;
  call_id: string;
  tool: string;
  /** The call's arguments whose text appears in this result. */
  arguments: string[];
  injection_suspected: boolean;
  /** The injection cues output safety found in the result. */
  cues: string[];
  /** The span to read: around the first argument found, or the passage flagged. */
  excerpt: string;
}

export interface CallTaint {
  influenced_by_untrusted: boolean;
  after_injection_suspected: boolean;
  arguments_from_untrusted: string[];
  sources: TaintSource[];
}

export interface PermissionNeed {
  kind: "tool" | "network" | "path";
  /** The permission's name, the host, or the workspace path. */
  name: string;
  /** Why it is needed, naming the rule that asks for it. */
  reason: string;
}

export interface Checkpoint {
  checkpoint_id: string;
  step_id: string;
  at_seq: number;
  created_at: string;
  reversible: boolean;
  compensation: string | null;
  snapshot_id: string | null;
  /** What the step changed in the workspace, when the sandbox ran it. */
  changes: FileChanges | null;
}

/** A step a rollback would undo, as its checkpoint says. */
export interface UndoneStep {
  step_id: string;
  compensation: string | null;
}

/** What a rollback to a checkpoint would undo: its `undoes` and `blocking_steps` name the
 * latest ten, newest first; the counts say how many there are. */
export interface RollbackReach {
  later: number;
  steps: number;
  undoes: UndoneStep[];
  file_changes: number;
  blocking: number;
  blocking_steps: string[];
}

/** `GET /sessions/{id}/rollback-points`: a checkpoint with what a rollback to it undoes. */
export interface CheckpointAt {
  index: number;
  checkpoint: Checkpoint;
  step_status: string | null;
  workspace_lost: string | null;
  rollback: RollbackReach;
}

export interface FileChanges {
  created: string[];
  modified: string[];
  deleted: string[];
  unlisted: number;
}

export interface Rollback {
  rollback_id: string;
  checkpoint_id: string;
  status: string;
  undone_steps: string[];
  not_undone_steps: string[];
  blocking_steps: string[];
  reason: string;
}

export interface Thought {
  kind: string;
  text: string;
  at: string;
  confidence: number | null;
  step_id: string | null;
}

export interface ForkOrigin {
  session_id: string;
  checkpoint_id: string | null;
  completed_steps: string[];
}

/** What a session's calls of one model used. */
export interface ModelTally {
  model: string;
  calls: number;
  input_tokens: number;
  output_tokens: number;
  cost_usd: number;
}

export interface SessionState {
  session_id: string;
  status: string;
  fork_of: ForkOrigin | null;
  goal: string;
  mode: string;
  plan_revision: number;
  plan_confidence: number | null;
  plan_estimated_duration_s: number | null;
  plan_permissions: string[];
  plan_reasoning: string;
  completion_criteria: string[];
  criteria_required: number | null;
  criteria: { criterion: string; met: boolean; evidence: string }[];
  steps: Record<string, Step>;
  approvals: Record<string, Approval>;
  checkpoints: Checkpoint[];
  /** Snapshots the workspace cannot return to (pruned, or never stored), with why. */
  unrestorable_snapshots: Record<string, string>;
  rollbacks: Record<string, Rollback>;
  thoughts: Thought[];
  pause_requested: boolean;
  /** Events folded into it: the session's log is this long. */
  event_count: number;
  outcome: string;
  started_at: string | null;
  model_calls: number;
  tokens_used: number;
  cost_usd: number;
  /** Calls, tokens and cost by model (planning, summarising and classifying may differ). */
  model_usage: ModelTally[];
}

export interface Me {
  id: string;
  tenant: string;
  roles: string[];
}

/** A session without its steps (`GET /sessions/{id}/overview`). */
export interface SessionOverview {
  /** The folded state with no steps, and only its latest checkpoints and thoughts. */
  state: SessionState;
  /** Stream sequence of the last event it reflects: ask for changes since this one. */
  last_seq: number;
  steps_total: number;
  steps_by_status: Record<string, number>;
  tools: Record<string, number>;
  calls_total: number;
  steps_underway: boolean;
  checkpoints_total: number;
  thoughts_total: number;
}

/** A step with where it is in the plan and in the call list. */
export interface StepAt {
  position: number;
  call_index: number | null;
  /** What serves its tool: `builtin`, or an MCP server's id. */
  server: string;
  /** How long its approval request waited for a person; null: it asked nobody. */
  approval_wait_ms: number | null;
  step: Step & { call_id: string | null; redacted_by: Record<string, number> };
}

/** Succeeded steps one after another in plan order, drawn as one row of the plan. */
export interface StepRun {
  first: string;
  last: string;
  steps: number;
  /** Its first step's index in plan order. */
  position: number;
}

export interface CallAt {
  index: number;
  call_id: string;
  /** Whether it is its step's latest call (the step's result, error and timing are its). */
  latest: boolean;
  step: StepAt;
}

export interface RangePage<T> {
  total: number;
  offset: number;
  items: T[];
}

/** An event as the log stores it: CloudEvents JSON, its payload under `data`. */
export interface CloudEvent {
  id: string;
  type: string;
  time: string;
  data: Record<string, unknown>;
}

/** An event with its stream sequence. */
export interface LoggedEvent {
  seq: number;
  event: CloudEvent;
}

/** `GET /sessions/{id}/log?after_seq=N`: the session's events after N, oldest first. */
export interface EventPage {
  items: LoggedEvent[];
  last_seq: number;
  /** More events were stored after the last item: page on from it. */
  more: boolean;
}

/** `GET /sessions/{id}/changes?since=N`. */
export interface SessionChanges {
  since: number;
  overview: SessionOverview;
  /** Too much changed to say step by step: read the rows shown again. */
  reset: boolean;
  steps: StepAt[];
}

/** A step drawn in the plan graph. */
export interface GraphNode {
  id: string;
  tool: string;
  status: string;
  layer: number;
  position: number;
  /** The steps it waits for that are drawn too. */
  depends_on: string[];
  hidden_depends_on: number;
}

export interface GraphLayer {
  layer: number;
  steps: number;
  by_status: Record<string, number>;
  shown: number;
}

/** `GET /sessions/{id}/graph`: a window of the plan's layers around a step. */
export interface PlanGraph {
  steps_total: number;
  layers_total: number;
  current: string | null;
  focus: string | null;
  first_layer: number;
  layers: GraphLayer[];
  nodes: GraphNode[];
  before: Record<string, number>;
  after: Record<string, number>;
}
