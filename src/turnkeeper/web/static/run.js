"use strict";
// One run as a conversation, streamed over SSE: its prompt, then what the agent said,
// the tools it called with their results, its usage, and a mark where each takeover
// happened; its attempts below, and a toggle for the raw chunks.
//
// Every chunk becomes exactly one element carrying data-seq. The page renders
// from seq 0 on each load and drops any seq it has already rendered, and the
// EventSource resumes with Last-Event-ID after a dropped connection, so a
// reload or a reconnect never shows a chunk twice or skips one.
//
// A takeover's attempt says where it began in the log (log_seq: the first seq it
// could append). Its mark goes right before that chunk: at once when the run is
// read before the chunk arrives, or moved in between the chunks already shown
// (a message or a tool call cut in two) when the page learns of it later.

const REFRESH_MS = 1500;
const runId = decodeURIComponent(location.pathname.replace(/^\/ui\/runs\//, ""));
const apiUrl = `/runs/${encodeURIComponent(runId)}`;
const conversation = document.getElementById("conversation");
const rawChunks = document.getElementById("raw-chunks");
const streamState = document.getElementById("stream-state");
const cancelButton = document.getElementById("cancel");
const messages = new Map();   // messageId -> element
const tools = new Map();      // toolCallId -> { box, args }
const toolNames = new Map();  // toolCallId -> name
const marked = new Set();     // epochs whose takeover mark is on the page
let pending = [];             // takeover marks whose chunk has not arrived yet
let lastSeq = 0;
let source = null;
let ended = false;

function mark(node, seq, chunk) {
  node.dataset.seq = String(seq);
  node.dataset.type = chunk.type;
  return node;
}

function marker(seq, chunk, name, text, extra) {
  const node = withIcon("div", { class: `marker ${extra || ""}`.trim() }, name, text);
  conversation.append(mark(node, seq, chunk));
}

function messageBox(id, kind) {
  let box = messages.get(id);
  if (!box) {
    box = el("div", { class: kind === "reasoning" ? "msg reasoning" : "msg", dir: "auto" });
    messages.set(id, box);
    conversation.append(box);
  }
  return box;
}

function toolBox(id) {
  let tool = tools.get(id);
  if (!tool) {
    const box = el("div", { class: "tool", "data-tool-call-id": id });
    const args = el("span", { class: "args" });
    if (toolNames.has(id)) {  // the rest of a call a takeover mark cut in two
      box.classList.add("continued");
      box.append(withIcon("span", { class: "name" }, "tool", `${toolNames.get(id)} `), args);
    }
    tool = { box, args };
    tools.set(id, tool);
    conversation.append(box);
  }
  return tool;
}

function number(value) {
  return Number(value).toLocaleString("en-US");
}

function usageText(value) {
  const usage = (value && value.usage) || {};
  const parts = [];
  if (usage.inputTokens !== undefined) parts.push(`${number(usage.inputTokens)} input`);
  if (usage.outputTokens !== undefined) parts.push(`${number(usage.outputTokens)} output tokens`);
  for (const [key, count] of Object.entries(usage)) {
    if (key !== "inputTokens" && key !== "outputTokens" && count) {
      parts.push(`${number(count)} ${key.replace(/([A-Z])/g, " $1").toLowerCase()}`);
    }
  }
  if (value && value.numTurns !== undefined) parts.push(`${value.numTurns} turns`);
  if (value && value.durationMs !== undefined) parts.push(`${(value.durationMs / 1000).toFixed(1)} s`);
  if (value && value.totalCostUsd) parts.push(`$${Number(value.totalCostUsd).toFixed(4)}`);
  return `usage: ${parts.join(" · ") || "none reported"}`;
}

function custom(seq, chunk) {
  const value = chunk.value || {};
  switch (chunk.name) {
    case "turnkeeper.interrupted":
      marker(seq, chunk, "interrupted",
        "the agent process was lost; the agent continues in a new process", "interrupted");
      break;
    case "turnkeeper.usage":
      marker(seq, chunk, "usage", usageText(value), "usage");
      break;
    case "turnkeeper.session":
      marker(seq, chunk, "agent",
        `agent session ${value.sessionId || "?"}${value.model ? ` · ${value.model}` : ""}`);
      break;
    case "turnkeeper.fresh_workspace":
      marker(seq, chunk, "info", `fresh workspace: ${value.reason || JSON.stringify(value)}`);
      break;
    case "turnkeeper.agent_error":
      marker(seq, chunk, "error", `agent error: ${value.message || JSON.stringify(value)}`, "error");
      break;
    default:
      marker(seq, chunk, "info", chunk.name);
  }
}

function render(seq, chunk) {
  switch (chunk.type) {
    case "TEXT_MESSAGE_START":
    case "TEXT_MESSAGE_END":
      messageBox(chunk.messageId).append(mark(el("span"), seq, chunk));
      break;
    case "TEXT_MESSAGE_CONTENT":
      messageBox(chunk.messageId).append(mark(el("span", {}, chunk.delta), seq, chunk));
      break;
    case "REASONING_MESSAGE_START":
    case "REASONING_MESSAGE_END":
      messageBox(chunk.messageId, "reasoning").append(mark(el("span"), seq, chunk));
      break;
    case "REASONING_MESSAGE_CONTENT":
      messageBox(chunk.messageId, "reasoning").append(mark(el("span", {}, chunk.delta), seq, chunk));
      break;
    case "TOOL_CALL_START": {
      const tool = toolBox(chunk.toolCallId);
      toolNames.set(chunk.toolCallId, chunk.toolCallName);
      tool.box.append(mark(withIcon("span", { class: "name" }, "tool", `${chunk.toolCallName} `), seq, chunk));
      tool.box.append(tool.args);
      break;
    }
    case "TOOL_CALL_ARGS":
      toolBox(chunk.toolCallId).args.append(mark(el("span", {}, chunk.delta), seq, chunk));
      break;
    case "TOOL_CALL_END":
      toolBox(chunk.toolCallId).box.append(mark(el("span"), seq, chunk));
      break;
    case "TOOL_CALL_RESULT": {
      const result = el("div", { class: "result" });
      const name = toolNames.get(chunk.toolCallId);
      result.append(withIcon("span", { class: "result-of" }, "result", name ? `${name} result` : "result"));
      result.append(el("span", { class: "content" }, chunk.content));
      if (chunk.metadata && chunk.metadata.isError) result.classList.add("failed");
      conversation.append(mark(result, seq, chunk));
      break;
    }
    case "RUN_STARTED":
      marker(seq, chunk, "start", "run started");
      break;
    case "RUN_FINISHED":
      marker(seq, chunk, "done", "finished", "finished");
      break;
    case "RUN_ERROR":
      marker(seq, chunk, "error", `error: ${chunk.message}`, "error");
      break;
    case "CUSTOM":
      custom(seq, chunk);
      break;
    default:
      marker(seq, chunk, "info", chunk.type);
  }
}

// --- takeover marks ---------------------------------------------------------------

const CAUSES = {
  crash: "its process died",
  lease: "its lease ran out",
  forced: "an operator handed the run over",
};

function takeoverText(previous, attempt) {
  const cause = CAUSES[previous.handover_cause];
  // The pause in the output the reader saw; else, the time from handover to adoption.
  let wait = "";
  if (attempt.takeover_seconds !== null) wait = ` after ${attempt.takeover_seconds.toFixed(1)} s`;
  else if (attempt.handover_seconds !== null) {
    wait = ` ${attempt.handover_seconds.toFixed(1)} s after the handover`;
  }
  // Only an admin key is told which worker (host:pid:token) owned the run.
  const worker = previous.owner ? `worker ${previous.owner}` : "its worker";
  return `${worker} stopped${cause ? ` (${cause})` : ""}; ` +
    `epoch ${attempt.epoch} took over${wait}; nothing was replayed to you`;
}

function takeoverMark(previous, attempt) {
  const node = withIcon("div", {
    class: "marker takeover",
    role: "note",
    "data-takeover-epoch": String(attempt.epoch),
    "data-before-seq": String(attempt.log_seq),
  }, "takeover", takeoverText(previous, attempt));
  return node;
}

function rawMark(attempt) {
  return el("div", { class: "raw-takeover", "data-takeover-epoch": String(attempt.epoch) },
    `epoch ${attempt.epoch} begins`);
}

// Open boxes end at a mark: later chunks of the same message or call go below it.
function closeBoxes() {
  messages.clear();
  tools.clear();
}

// Move a mark in before the rendered chunk ``seq``, cutting its box in two.
function insertBefore(node, seq) {
  const target = conversation.querySelector(`[data-seq="${seq}"]`);
  if (!target) {  // never the case: every seq up to the last is shown
    conversation.append(node);
    return;
  }
  const box = target.closest("#conversation > *");
  if (box === target || box.querySelector("[data-seq]") === target) {
    box.before(node);
    return;
  }
  const range = document.createRange();
  range.setStartBefore(target);
  range.setEndAfter(box.lastChild);
  const rest = box.cloneNode(false);
  rest.classList.add("continued");
  rest.append(range.extractContents());
  box.after(node, rest);
  for (const [id, message] of messages) if (message === box) messages.set(id, rest);
  if (box.classList.contains("tool")) {
    const id = box.dataset.toolCallId;
    let args = rest.querySelector(".args");
    if (!args) {
      args = el("span", { class: "args" });
      rest.append(args);
    }
    rest.prepend(withIcon("span", { class: "name" }, "tool", `${toolNames.get(id)} `));
    if (tools.has(id)) tools.set(id, { box: rest, args });
  }
}

function placeTakeover(item) {
  marked.add(item.attempt.epoch);
  const { node, raw, attempt } = item;
  if (attempt.log_seq <= lastSeq) {
    insertBefore(node, attempt.log_seq);
    const line = rawChunks.querySelector(`[data-raw-seq="${attempt.log_seq}"]`);
    if (line) line.before(raw);
    else rawChunks.append(raw);
  } else {
    conversation.append(node);
    rawChunks.append(raw);
    closeBoxes();
  }
}

function learnTakeovers(attempts) {
  attempts.forEach((attempt, index) => {
    if (index === 0 || attempt.log_seq === null) return;
    const known = conversation.querySelector(`.marker.takeover[data-takeover-epoch="${attempt.epoch}"]`)
      || (pending.find((item) => item.attempt.epoch === attempt.epoch) || {}).node;
    if (known) {  // its words may have changed: the pause is known once the successor stored output
      known.lastChild.textContent = takeoverText(attempts[index - 1], attempt);
      return;
    }
    if (marked.has(attempt.epoch)) return;
    const item = { attempt, node: takeoverMark(attempts[index - 1], attempt), raw: rawMark(attempt) };
    if (attempt.log_seq <= lastSeq) placeTakeover(item);
    else pending.push(item);
  });
}

function placeDue(seq) {
  const due = pending.filter((item) => item.attempt.log_seq <= seq);
  if (due.length === 0) return;
  pending = pending.filter((item) => item.attempt.log_seq > seq);
  for (const item of due) placeTakeover(item);
}

// --- the stream -------------------------------------------------------------------

function rawLine(seq, text) {
  const line = el("div", { class: "raw-chunk", "data-raw-seq": String(seq) });
  line.append(el("span", { class: "raw-seq" }, seq), document.createTextNode(text));
  rawChunks.append(line);
}

function onChunk(event) {
  const seq = Number(event.lastEventId);
  if (!Number.isInteger(seq) || seq <= lastSeq) return;  // already rendered
  placeDue(seq);
  lastSeq = seq;
  rawLine(seq, event.data);
  render(seq, JSON.parse(event.data));
  conversation.dataset.lastSeq = String(lastSeq);
  streamState.textContent = `live · seq ${lastSeq}`;
}

function connect(streamUrl) {
  source = new EventSource(streamUrl);  // from offset 0; reconnects send Last-Event-ID
  source.onmessage = onChunk;
  source.addEventListener("end", () => {
    ended = true;
    source.close();
    conversation.dataset.ended = "true";
    streamState.textContent = `ended · ${lastSeq} chunks`;
  });
  source.addEventListener("log-error", (event) => {
    ended = true;
    source.close();
    streamState.textContent = `stream failed: ${JSON.parse(event.data).message}`;
  });
  source.onerror = () => {
    if (!ended) streamState.textContent = `reconnecting after seq ${lastSeq}…`;
  };
}

// --- the run: summary, prompt, attempts, cancel -------------------------------------

function field(name, value) {
  const cell = el("div", { "data-field": name });
  cell.append(el("span", {}, name));
  if (value instanceof Node) cell.append(value);
  else cell.append(document.createTextNode(String(value === null || value === undefined ? "-" : value)));
  return cell;
}

function showSummary(run) {
  const href = `/ui/sessions/${encodeURIComponent(run.session_id)}`;
  const live = run.status === "queued" || run.status === "running";
  const step = phaseText(run);
  const cells = [
    field("status", statusPill(run.status)),
    ...(step ? [field("step", step)] : []),
    field("epoch", run.epoch),
    field("attempts", `${run.attempt_count}/${run.max_attempts}`),
    ...(run.status === "running" && run.owner ? [field("owner", ownerNode(run.owner))] : []),
    ...(run.status === "running" ? [field("lease", leaseText(run))] : []),
    field("agent", run.agent || "-"),
    field("session", el("a", { href, id: "session-link", dir: "auto" }, run.session_id)),
    ...(run.key_name ? [field("key", run.key_name)] : []),
    field("created", fullTime(run.created_at)),
    field("started", fullTime(run.started_at)),
    ...(live ? [] : [field("finished", fullTime(run.finished_at))]),
    field("duration", durationText(run.duration_seconds)),
  ];
  document.getElementById("summary").replaceChildren(...cells);
  showFailure(run);
  cancelButton.hidden = !live;
  if (live && run.cancel_requested_at) cancelLabel("cancelling…", true);
  document.body.dataset.status = run.status;
}

// Why a run failed, in words: its reason and message, the agent's exit code, what its
// limits stopped, and the end of what it wrote to stderr (as text, never as JSON).
function showFailure(run) {
  const box = document.getElementById("failure");
  const error = run.error;
  if (!error || run.status === "completed") {
    box.hidden = true;
    return;
  }
  const parts = [el("p", { class: "failure-reason", dir: "auto" }, errorText(error))];
  if (typeof error === "object") {
    if (Number.isInteger(error.exit_code) && error.reason !== "agent-exit") {
      parts.push(el("p", { class: "failure-exit" }, `the agent's exit code: ${error.exit_code}`));
    }
    if (error.limits && typeof error.limits === "object") {
      const hit = Object.entries(error.limits)
        .map(([name, value]) => `${String(name).replace(/_/g, " ")} ${value}`).join(", ");
      if (hit) parts.push(el("p", { class: "failure-limits" }, `limits hit: ${hit}`));
    }
    if (typeof error.stderr === "string" && error.stderr.trim()) {
      const details = el("details", { class: "failure-stderr" });
      details.append(el("summary", {}, "the end of the agent's stderr"), el("pre", { dir: "auto" }, error.stderr));
      parts.push(details);
    }
  }
  const open = box.querySelector("details")?.open;
  box.replaceChildren(...parts);
  if (open) box.querySelector("details").open = true;
  box.hidden = false;
}

function showPrompt(run) {
  const box = document.getElementById("prompt");
  if (typeof run.prompt !== "string") return;
  box.replaceChildren(withIcon("div", { class: "who" }, "user", "prompt"), el("div", { class: "msg user", dir: "auto" }, run.prompt));
  box.hidden = false;
}

function cellWith(td, node) {
  td.append(node);
  return td;
}

function showAttempts(run) {
  const rows = (run.attempts || []).map((attempt) => {
    const row = el("tr", { "data-attempt": String(attempt.attempt) });
    const outcome = attempt.outcome || (run.status === "running" ? "running" : "open");
    const cause = attempt.handover_cause ? ` (${attempt.handover_cause})` : "";
    row.append(
      el("td", { "data-label": "attempt" }, attempt.attempt),
      cellWith(el("td", { "data-label": "owner", class: "owner" }), ownerNode(attempt.owner)),
      el("td", { "data-label": "epoch" }, attempt.epoch),
      el("td", { "data-label": "started" }, fullTime(attempt.started_at)),
      el("td", { "data-label": "ended" }, fullTime(attempt.ended_at)),
      el("td", { "data-label": "outcome", class: `outcome ${outcome}` }, `${outcome}${cause}`),
    );
    return row;
  });
  if (rows.length === 0) {
    rows.push(el("tr", {}, ""));
    rows[0].append(el("td", { colspan: "6", class: "meta" }, "no attempt yet: the run waits for a worker"));
  }
  document.getElementById("attempts").replaceChildren(...rows);
}

function showRun(run) {
  showSummary(run);
  showAttempts(run);
  learnTakeovers(run.attempts || []);
}

async function refreshRun() {
  try {
    const run = await getJSON(apiUrl);
    showRun(run);
    if (run.status === "running" || run.status === "queued") setTimeout(refreshRun, REFRESH_MS);
  } catch (error) {
    streamState.textContent = error.message;
    setTimeout(refreshRun, REFRESH_MS);
  }
}

function cancelLabel(text, disabled) {
  cancelButton.querySelector(".label").textContent = text;
  cancelButton.disabled = disabled;
}

cancelButton.addEventListener("click", async () => {
  const problem = document.getElementById("cancel-error");
  cancelLabel("cancelling…", true);
  problem.hidden = true;
  try {
    showSummary(await postJSON(`${apiUrl}/cancel`));
  } catch (error) {
    problem.textContent = `The run could not be cancelled: ${error.message}`;
    problem.hidden = false;
    cancelLabel("cancel run", false);
  }
});

document.getElementById("raw-toggle").addEventListener("click", (event) => {
  const raw = document.getElementById("raw");  // the raw chunks stand in for the conversation
  raw.hidden = !raw.hidden;
  conversation.hidden = !raw.hidden;
  event.currentTarget.setAttribute("aria-pressed", String(!raw.hidden));
});

async function start() {
  document.getElementById("run-id").textContent = runId;
  document.title = `turnkeeper: ${runId}`;
  let run;
  try {
    run = await getJSON(apiUrl);
  } catch (error) {
    if (error.status === 404 || error.status === 400) {
      // Another tenant's run is a 404 like a run that does not exist: a plain page.
      showNotFound(`No run “${runId}” is visible to this key: it does not exist, or another key owns it.`);
      return;
    }
    document.getElementById("run-main").hidden = false;
    streamState.textContent = error.message;
    setTimeout(start, REFRESH_MS);
    return;
  }
  document.getElementById("run-main").hidden = false;
  showPrompt(run);
  showRun(run);
  connect(run.stream_url);
  setTimeout(refreshRun, REFRESH_MS);
}

document.getElementById("raw-toggle").prepend(icon("raw"));
cancelButton.prepend(icon("stop"));

if (apiKey()) {
  showIdentity().catch(() => {});
  start();
}
