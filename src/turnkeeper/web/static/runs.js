"use strict";
// The runs table: refetched every 1.5 s, newest first; the key's own runs (every run
// for an admin key: the API decides).

const REFRESH_MS = 1500;

function runRow(run) {
  const row = el("tr", { "data-run-id": run.run_id });
  const link = el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}` }, run.run_id);
  const idCell = el("td", { class: "run" });
  idCell.append(link);
  const statusCell = el("td");
  statusCell.append(el("span", { class: `status ${run.status}` }, run.status));
  const lease = el("td", {}, leaseText(run));
  if (run.lease_seconds_left !== null && run.lease_seconds_left < 0) lease.className = "expired";
  row.append(
    idCell,
    statusCell,
    el("td", {}, run.phase || "-"),
    el("td", { class: "epoch" }, run.epoch),
    el("td", {}, `${run.attempt_count}/${run.max_attempts}`),
    el("td", {}, run.owner || "-"),
    lease,
    el("td", {}, shortTime(run.created_at)),
  );
  return row;
}

async function refresh() {
  try {
    const body = await getJSON("/runs?limit=100");
    document.getElementById("runs").replaceChildren(...body.runs.map(runRow));
    document.getElementById("refreshed").textContent =
      `${body.runs.length} run(s), refreshed ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("refreshed").textContent = `refresh failed: ${error.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

if (apiKey()) {
  showIdentity().catch(() => {});
  refresh();
}
