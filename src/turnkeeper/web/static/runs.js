"use strict";
// The runs table: refetched every 1.5 s, newest first; the key's own runs (every run
// for an admin key: the API decides). The filters and the page live in the URL's
// query (?search=&status=&agent=&session=&key=&page=), so a reload, a link or the
// back button keeps the user's place; a refresh changes nothing but the rows.
// ?per=N (1 to 100) sets the page size.

const REFRESH_MS = 1500;
const FILTERS = [  // [URL and form name, API parameter]
  ["search", "search"], ["status", "status"], ["agent", "agent"],
  ["session", "session_id"], ["key", "key"],
];
const form = document.getElementById("filters");
let admin = false;
let timer = null;
let generation = 0;  // a newer query makes an older answer stale

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
  for (const [name] of FILTERS) form.elements[name].value = params.get(name) || "";
}

function setQuery(changes) {
  const params = new URLSearchParams(location.search);
  for (const [name, value] of Object.entries(changes)) {
    if (value === "" || value === null || value === 1) params.delete(name);
    else params.set(name, String(value));
  }
  const search = params.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
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
  return api;
}

function cell(label, content, attrs) {
  const td = el("td", { "data-label": label, ...(attrs || {}) });
  if (content instanceof Node) td.append(content);
  else td.textContent = content === null || content === undefined ? "-" : String(content);
  return td;
}

function runRow(run) {
  const row = el("tr", { "data-run-id": run.run_id });
  const link = el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}` }, run.run_id);
  const session = run.session_id === run.run_id
    ? el("span", { class: "meta" }, "own")
    : el("a", { href: `/ui/sessions/${encodeURIComponent(run.session_id)}` }, run.session_id);
  const lease = cell("lease", leaseText(run), { class: "lease" });
  if (run.lease_seconds_left !== null && run.lease_seconds_left < 0) lease.classList.add("expired");
  row.append(
    cell("run", link, { class: "run" }),
    cell("status", statusPill(run.status)),
    cell("agent", run.agent),
    cell("session", session, { class: "session" }),
    cell("key", run.key_name, { class: "key-column" }),
    cell("phase", run.phase, { class: "phase" }),
    cell("epoch", run.epoch, { class: "epoch" }),
    cell("attempts", `${run.attempt_count}/${run.max_attempts}`),
    cell("owner", run.owner, { class: "owner" }),
    lease,
    cell("created", shortTime(run.created_at)),
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
    const body = await getJSON(`/runs?${apiQuery()}`);
    if (mine !== generation) return;
    document.getElementById("runs").replaceChildren(...body.runs.map(runRow));
    showPage(body, page);
    state.textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    state.classList.remove("error");
    document.querySelector("table.runs").dataset.query = apiQuery().toString();
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
  for (const [name] of FILTERS) changes[name] = form.elements[name].value.trim();
  setQuery(changes);
});
document.getElementById("f-clear").addEventListener("click", () => {
  form.reset();
  const per = new URLSearchParams(location.search).get("per");
  history.replaceState(null, "", per ? `?per=${encodeURIComponent(per)}` : location.pathname);
  refresh();
});
document.getElementById("page-prev").addEventListener("click", () => {
  setQuery({ page: Math.max(1, query().page - 1) });
});
document.getElementById("page-next").addEventListener("click", () => {
  setQuery({ page: query().page + 1 });
});
window.addEventListener("popstate", () => { fillForm(); refresh(); });

async function showKeyFilter() {
  const key = await getJSON("/key");
  admin = key.admin;
  document.getElementById("f-key-label").hidden = !admin;
  document.body.classList.toggle("admin", admin);
}

if (apiKey()) {
  fillForm();
  showIdentity().catch(() => {});
  showKeyFilter().catch(() => {});
  refresh();
}
