"use strict";
// One run as a conversation, streamed over SSE.
//
// Every chunk becomes exactly one element carrying data-seq. The page renders
// from seq 0 on each load and drops any seq it has already rendered, and the
// EventSource resumes with Last-Event-ID after a dropped connection, so a
// reload or a reconnect never shows a chunk twice or skips one.

const runId = decodeURIComponent(location.pathname.replace(/^\/ui\/runs\//, ""));
const apiUrl = `/runs/${encodeURIComponent(runId)}`;
const conversation = document.getElementById("conversation");
const streamState = document.getElementById("stream-state");
const messages = new Map();  // messageId -> element
const tools = new Map();     // toolCallId -> { box, args }
let lastSeq = 0;
let source = null;
let ended = false;

function mark(node, seq, chunk) {
  node.dataset.seq = String(seq);
  node.dataset.type = chunk.type;
  return node;
}

function marker(seq, chunk, text, extra) {
  conversation.append(mark(el("div", { class: `marker ${extra || ""}` }, text), seq, chunk));
}

function messageBox(id) {
  let box = messages.get(id);
  if (!box) {
    box = el("div", { class: "msg" });
    messages.set(id, box);
    conversation.append(box);
  }
  return box;
}

function toolBox(id) {
  let tool = tools.get(id);
  if (!tool) {
    const box = el("div", { class: "tool" });
    const args = el("span", { class: "args" });
    tool = { box, args };
    tools.set(id, tool);
    conversation.append(box);
  }
  return tool;
}

function render(seq, chunk) {
  switch (chunk.type) {
    case "TEXT_MESSAGE_START":
      messageBox(chunk.messageId).append(mark(el("span"), seq, chunk));
      break;
    case "TEXT_MESSAGE_CONTENT":
      messageBox(chunk.messageId).append(mark(el("span", {}, chunk.delta), seq, chunk));
      break;
    case "TEXT_MESSAGE_END":
      messageBox(chunk.messageId).append(mark(el("span"), seq, chunk));
      break;
    case "TOOL_CALL_START": {
      const tool = toolBox(chunk.toolCallId);
      tool.box.append(mark(el("span", { class: "name" }, `⏺ ${chunk.toolCallName} `), seq, chunk));
      tool.box.append(tool.args);
      break;
    }
    case "TOOL_CALL_ARGS":
      toolBox(chunk.toolCallId).args.append(mark(el("span", {}, chunk.delta), seq, chunk));
      break;
    case "TOOL_CALL_END":
      toolBox(chunk.toolCallId).box.append(mark(el("span"), seq, chunk));
      break;
    case "TOOL_CALL_RESULT":
      conversation.append(mark(el("div", { class: "result" }, chunk.content), seq, chunk));
      break;
    case "RUN_STARTED":
      marker(seq, chunk, "● run started");
      break;
    case "RUN_FINISHED":
      marker(seq, chunk, "● finished");
      break;
    case "RUN_ERROR":
      marker(seq, chunk, `● error: ${chunk.message}`, "error");
      break;
    case "CUSTOM":
      marker(seq, chunk, chunk.name === "turnkeeper.interrupted"
        ? "● interrupted: the agent continues in a new process" : `● ${chunk.name}`);
      break;
    default:
      marker(seq, chunk, `● ${chunk.type}`);
  }
}

function onChunk(event) {
  const seq = Number(event.lastEventId);
  if (!Number.isInteger(seq) || seq <= lastSeq) return;  // already rendered
  lastSeq = seq;
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

function showSummary(run) {
  const fields = [
    ["status", run.status], ["phase", run.phase || "-"], ["epoch", run.epoch],
    ["attempts", `${run.attempt_count}/${run.max_attempts}`], ["owner", run.owner || "-"],
    ["lease", leaseText(run)],
  ];
  const cells = fields.map(([name, value]) => {
    const cell = el("div", { "data-field": name });
    cell.append(el("span", {}, name), document.createTextNode(String(value)));
    return cell;
  });
  const session = el("div", { "data-field": "session" });
  const href = `/ui/sessions/${encodeURIComponent(run.session_id)}`;
  session.append(el("span", {}, "session"), el("a", { href, id: "session-link" }, run.session_id));
  cells.push(session);
  document.getElementById("summary").replaceChildren(...cells);
}

async function refreshSummary() {
  try {
    const run = await getJSON(apiUrl);
    showSummary(run);
    if (run.status === "running" || run.status === "queued") setTimeout(refreshSummary, 1500);
  } catch (error) {
    streamState.textContent = error.message;
  }
}

async function start() {
  document.getElementById("run-id").textContent = runId;
  document.title = `turnkeeper: ${runId}`;
  try {
    const run = await getJSON(apiUrl);
    showSummary(run);
    connect(run.stream_url);
    setTimeout(refreshSummary, 1500);
  } catch (error) {
    streamState.textContent = error.message;
  }
}

if (apiKey()) {
  showIdentity().catch(() => {});
  start();
}
