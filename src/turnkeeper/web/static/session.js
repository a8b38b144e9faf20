"use strict";
// One session as a conversation across its runs, along one path of its transcript tree.
//
// GET /sessions/{id} gives every entry with its parent, the active path (root to the
// session's leaf) and the runs. The page shows the active path first; where an entry
// has more than one child the tree branches, and the page offers each child: choosing
// one shows that branch's path instead. Switching is display-only: the API has no way
// to move the session's leaf, so the next message still follows the active path
// (a run started with parent_entry_id is what makes a branch active).

const REFRESH_MS = 1500;
const RESULT_CHARS = 2000;  // a tool's result is shown compactly: its first characters
const sessionId = decodeURIComponent(location.pathname.replace(/^\/ui\/sessions\//, ""));
const apiUrl = `/sessions/${encodeURIComponent(sessionId)}`;
const conversation = document.getElementById("conversation");
const sessionState = document.getElementById("session-state");
const branchState = document.getElementById("branch-state");
let tree = null;       // the last answer of the API
let shownLeaf = null;  // the leaf of the path on display; null: the active leaf

function indexTree(body) {
  const byId = new Map(body.entries.map((entry) => [entry.entry_id, entry]));
  const children = new Map();  // parent id (null for roots) -> entries, in stored order
  for (const entry of body.entries) {
    const siblings = children.get(entry.parent_id) || [];
    siblings.push(entry);
    children.set(entry.parent_id, siblings);
  }
  const statusOf = new Map(body.runs.map((run) => [run.run_id, run.status]));
  return { ...body, byId, children, statusOf, onActive: new Set(body.active_path) };
}

function pathTo(leafId) {
  const path = [];
  for (let entry = tree.byId.get(leafId); entry; entry = tree.byId.get(entry.parent_id)) {
    path.unshift(entry);
  }
  return path;
}

function leafUnder(entry) {
  // Down from a branch's first entry: through the active path where it goes on, else
  // through the newest child, to an entry without children.
  for (;;) {
    const next = tree.children.get(entry.entry_id) || [];
    if (next.length === 0) return entry.entry_id;
    entry = next.find((child) => tree.onActive.has(child.entry_id)) || next[next.length - 1];
  }
}

function kindOf(node, kind, entry) {
  node.dataset.kind = kind;
  node.dataset.entryId = entry.entry_id;
  return node;
}

function firstLine(text, most) {
  const line = String(text).split("\n")[0];
  return line.length > most ? `${line.slice(0, most)}…` : line;
}

function branchLabel(entry) {
  const what = entry.kind === "user" ? `“${firstLine(entry.body.prompt, 40)}”` : entry.kind;
  return `run ${entry.run_id}: ${what}${tree.onActive.has(entry.entry_id) ? " (active)" : ""}`;
}

function branchPoint(siblings, chosen) {
  const box = el("div", { class: "branch", "data-parent-id": chosen.parent_id || "" });
  box.append(withIcon("span", { class: "meta" }, "branch", `the conversation branches (${siblings.length}):`));
  for (const sibling of siblings) {
    const current = sibling.entry_id === chosen.entry_id;
    const button = el("button", {
      type: "button",
      class: current ? "branch-choice current" : "branch-choice",
      "aria-pressed": String(current),
      "data-entry-id": sibling.entry_id,
    }, branchLabel(sibling));
    button.addEventListener("click", () => {
      shownLeaf = leafUnder(sibling);
      render();
    });
    box.append(button);
  }
  return box;
}

function entryNodes(entry) {
  const body = entry.body || {};
  switch (entry.kind) {
    case "user":
      return [kindOf(el("div", { class: "msg user" }, body.prompt), "user", entry)];
    case "assistant": {
      const nodes = (body.messages || []).map((message) =>
        kindOf(el("div", { class: "msg" }, message.text), "assistant", entry));
      for (const call of body.toolCalls || []) {
        const box = kindOf(el("div", { class: "tool" }), "tool-call", entry);
        box.append(withIcon("span", { class: "name" }, "tool", `${call.name} `), el("span", { class: "args" }, call.args));
        nodes.push(box);
      }
      return nodes;
    }
    case "tool":
      return (body.results || []).map((result) => {
        const content = String(result.content);
        const shown = content.length > RESULT_CHARS ? `${content.slice(0, RESULT_CHARS)}…` : content;
        const box = el("div", { class: "result" });
        box.append(withIcon("span", { class: "result-of" }, "result", "result"));
        box.append(kindOf(el("span", { class: "content" }, shown), "tool-result", entry));
        return box;
      });
    default:
      return [kindOf(withIcon("div", { class: "marker" }, "info", entry.kind), entry.kind, entry)];
  }
}

function render() {
  const leaf = shownLeaf !== null && tree.byId.has(shownLeaf) ? shownLeaf : tree.leaf_id;
  const path = leaf === null ? [] : pathTo(leaf);
  const nodes = [];
  let run = null;
  for (const entry of path) {
    const siblings = tree.children.get(entry.parent_id) || [];
    if (siblings.length > 1) nodes.push(branchPoint(siblings, entry));
    if (entry.run_id !== run) {
      run = entry.run_id;
      const marker = withIcon("div", { class: "marker run-start" }, "start", "run ");
      marker.append(el("a", { href: `/ui/runs/${encodeURIComponent(run)}` }, run));
      const status = tree.statusOf.get(run);
      if (status) marker.append(document.createTextNode(" "), statusPill(status));
      nodes.push(marker);
    }
    nodes.push(...entryNodes(entry));
  }
  if (path.length === 0) nodes.push(withIcon("div", { class: "marker" }, "info", "no messages yet"));
  conversation.replaceChildren(...nodes);
  conversation.dataset.leaf = leaf || "";
  const onActive = leaf === tree.leaf_id;
  conversation.dataset.activePath = String(onActive);
  branchState.textContent = onActive
    ? "Showing the active branch: the session's next message follows it."
    : "Showing another branch (display only): the session's next message still follows the active branch.";
}

function showRuns(runs) {
  const cells = runs.map((run, index) => {
    const cell = el("div", { "data-run-id": run.run_id });
    cell.append(
      el("span", { class: "label" }, `run ${index + 1}`),
      el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}` }, run.run_id),
      document.createTextNode(" "),
      statusPill(run.status),
    );
    return cell;
  });
  document.getElementById("session-runs").replaceChildren(...cells);
}

function showRefusal(error) {
  const message = error.status === 404
    ? `No session “${sessionId}” is visible to this key: it does not exist, or another key owns it.`
    : `The session could not be loaded: ${error.message}`;
  conversation.replaceChildren(el("p", { class: "error", id: "session-error", role: "alert" }, message));
  sessionState.textContent = error.status === 404 ? "not found" : "failed";
}

async function load() {
  let busy = false;
  try {
    const body = await getJSON(apiUrl);
    tree = indexTree(body);
    showRuns(body.runs);
    render();
    busy = body.runs.some((run) => run.status === "queued" || run.status === "running");
    sessionState.textContent = busy
      ? "live" : `${body.runs.length} run(s), ${body.entries.length} entries`;
    conversation.dataset.loaded = busy ? "live" : "settled";
  } catch (error) {
    showRefusal(error);
  }
  if (busy) setTimeout(load, REFRESH_MS);
}

if (apiKey()) {
  document.getElementById("session-id").textContent = sessionId;
  document.title = `turnkeeper: session ${sessionId}`;
  showIdentity().catch(() => {});
  load();
}
