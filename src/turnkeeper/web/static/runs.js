"use strict";
// The runs table: refetched every 1.5 s, newest first; the key's own runs (every run
// for an admin key: the API decides). The filters and the page live in the URL's
// query (?search=&status=&agent=&session=&key=&within=&page=), so a reload, a link or
// the back button keeps the user's place; a refresh changes nothing but the rows.
// ?per=N (1 to 100) sets the page size. ?within=M keeps the runs created in the last M
// minutes (of the server's clock); a chart of the fleet page links here with a window
// of its own (?created_since=, ?created_until=, ?finished_since=, ?finished_until=,
// ISO times passed on to the API as they are).

const REFRESH_MS = 1500;
const FILTERS = [  // [URL and form name, API parameter]
  ["search", "search"], ["status", "status"], ["agent", "agent"],
  ["session", "session_id"], ["key", "key"],
];
const WINDOW = ["created_since", "created_until", "finished_since", "finished_until"];
const FORM_NAMES = [...FILTERS.map(([name]) => name), "within"];
const form = document.getElementById("filters");
let timer = null;
let generation = 0;  // a newer query makes an older answer stale
let skew = 0;  // the server's clock minus this one's, from the last answer

function query() {
  const params = new URLSearchParams(location.search);
  const page = Number.parseInt(params.get("page") || "1", 10);
  const per = Number.parseInt(params.get("per") || "25", 10);
  return {
    params,
    page: Number.isInteger(page) && page >= 1 ? page : 1,
    per: Number.isInteger(per) && per >= 1 && per <= 100 ? per : 25,
  };
}

function fillForm() {
  const { params } = query();
  for (const name of FORM_NAMES) form.elements[name].value = params.get(name) || "";
  showWindow(params);
}

function setQuery(changes) {
  const params = new URLSearchParams(location.search);
  for (const [name, value] of Object.entries(changes)) {
    if (value === "" || value === null || value === 1) params.delete(name);
    else params.set(name, String(value));
  }
  const search = params.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
  showWindow(params);
  refresh();
}

function apiQuery() {
  const { params, page, per } = query();
  const api = new URLSearchParams({ limit: String(per) });
  if (page > 1) api.set("offset", String((page - 1) * per));
  for (const [name, parameter] of FILTERS) {
    const value = (params.get(name) || "").trim();
    if (value) api.set(parameter, value);
  }
  for (const name of WINDOW) {
    const value = (params.get(name) || "").trim();
    if (value) api.set(name, value);
  }
  const within = Number.parseInt(params.get("within") || "", 10);
  if (Number.isInteger(within) && within > 0 && !params.get("created_since")) {
    api.set("created_since", new Date(Date.now() + skew - within * 60_000).toISOString());
  }
  return api;
}

// The window a chart's link set, in words: "finished 14:03 to 14:04".
function showWindow(params) {
  const chip = document.getElementById("f-window");
  const parts = [];
  for (const what of ["created", "finished"]) {
    const since = params.get(`${what}_since`);
    const until = params.get(`${what}_until`);
    if (since && until) parts.push(`${what} ${whenText(since)} to ${whenText(until)}`);
    else if (since) parts.push(`${what} since ${whenText(since)}`);
    else if (until) parts.push(`${what} before ${whenText(until)}`);
  }
  document.getElementById("f-window-text").textContent = parts.join(", ");
  chip.hidden = parts.length === 0;
}

function cell(label, content, attrs) {
  const td = el("td", { "data-label": label, ...(attrs || {}) });
  if (content instanceof Node) td.append(content);
  else td.textContent = content === null || content === undefined || content === "" ? "-" : String(content);
  return td;
}

// A cell that shows one line, cut with an ellipsis, and the whole text on hover.
function clipped(label, text, cls) {
  const td = cell(label, text, { class: `clip ${cls}`, dir: "auto" });
  if (text) td.title = text;
  return td;
}

function runRow(run) {
  const row = el("tr", { "data-run-id": run.run_id, "data-status": run.status });
  const link = el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}`, dir: "auto" }, run.run_id);
  const id = cell("run", link, { class: "run clip", title: run.run_id });
  const prompt = typeof run.prompt_preview === "string" ? run.prompt_preview : "";
  const firstLine = prompt.split("\n")[0];
  const promptCell = clipped("prompt", firstLine, "prompt-cell");
  if (prompt) promptCell.title = prompt;
  const started = cell("started", whenText(run.started_at), { class: "started" });
  if (run.started_at) started.title = fullTime(run.started_at);
  const attempts = cell("attempts", `${run.attempt_count}/${run.max_attempts}`, { class: "attempts" });
  attempts.title = `${run.attempt_count} of at most ${run.max_attempts} attempts`;
  const failed = run.status === "failed" || run.status === "aborted";
  row.append(
    id,
    cell("status", statusPill(run.status), { class: "status-cell" }),
    clipped("agent", run.agent, "agent"),
    clipped("key", run.key_name, "key-column"),
    promptCell,
    started,
    cell("duration", durationText(run.duration_seconds), { class: "duration" }),
    attempts,
    clipped("error", failed ? errorText(run.error) : "", "error-cell"),
  );
  return row;
}

function showPage(body, page) {
  const first = body.runs.length ? body.offset + 1 : 0;
  const last = body.offset + body.runs.length;
  const pages = Math.max(1, Math.ceil(body.total / body.limit));
  const more = body.total_exact ? "" : "+";  // counted only so far
  document.getElementById("page-range").textContent = body.total
    ? `${first}-${last} of ${body.total}${more} · page ${page} of ${pages}${more}` : "";
  document.getElementById("page-prev").disabled = page <= 1;
  document.getElementById("page-next").disabled = body.total_exact && last >= body.total;
  document.getElementById("no-runs").hidden = body.runs.length > 0;
  const table = document.querySelector("table.runs");
  table.dataset.total = String(body.total);
  table.dataset.page = String(page);
  const seen = document.getElementById("agents-seen");
  const known = new Set([...seen.options].map((option) => option.value));
  for (const run of body.runs) {
    if (run.agent && !known.has(run.agent)) {
      known.add(run.agent);
      seen.append(el("option", { value: run.agent }));
    }
  }
}

async function refresh() {
  clearTimeout(timer);
  const mine = ++generation;
  const { page } = query();
  const state = document.getElementById("refreshed");
  try {
    const asked = apiQuery();
    const body = await getJSON(`/runs?${asked}`);
    if (mine !== generation) return;
    skew = new Date(body.now) - Date.now();
    document.getElementById("runs").replaceChildren(...body.runs.map(runRow));
    showPage(body, page);
    state.textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    state.classList.remove("error");
    asked.delete("created_since");  // a moving bound: the rest says what was asked
    document.querySelector("table.runs").dataset.query = asked.toString();
  } catch (error) {
    if (mine !== generation) return;
    state.textContent = `refresh failed: ${error.message}`;
    state.classList.add("error");
  } finally {
    if (mine === generation) timer = setTimeout(refresh, REFRESH_MS);
  }
}

let typing = null;
form.addEventListener("input", (event) => {
  const name = event.target.name;
  if (!name) return;
  clearTimeout(typing);
  const value = event.target.value.trim();
  const apply = () => setQuery({ [name]: value, page: 1 });
  if (event.target.tagName === "SELECT") apply();
  else typing = setTimeout(apply, 300);  // one query per pause in the typing
});
form.addEventListener("submit", (event) => {
  event.preventDefault();
  const changes = { page: 1 };
  for (const name of FORM_NAMES) changes[name] = form.elements[name].value.trim();
  setQuery(changes);
});
document.getElementById("f-clear").addEventListener("click", () => {
  form.reset();
  const per = new URLSearchParams(location.search).get("per");
  history.replaceState(null, "", per ? `?per=${encodeURIComponent(per)}` : location.pathname);
  showWindow(new URLSearchParams());
  refresh();
});
document.getElementById("f-window-clear").addEventListener("click", () => {
  setQuery({ ...Object.fromEntries(WINDOW.map((name) => [name, ""])), page: 1 });
});
document.getElementById("page-prev").addEventListener("click", () => {
  setQuery({ page: Math.max(1, query().page - 1) });
});
document.getElementById("page-next").addEventListener("click", () => {
  setQuery({ page: query().page + 1 });
});
window.addEventListener("popstate", () => { fillForm(); refresh(); });

async function showKeyFilter() {
  const key = await showIdentity();
  document.getElementById("f-key-label").hidden = !key.admin;
  document.body.classList.toggle("admin", key.admin);
}

if (apiKey()) {
  fillForm();
  showKeyFilter().catch(() => {});
  refresh();
}
