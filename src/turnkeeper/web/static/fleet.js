"use strict";
// The fleet page (an admin key's; any other key gets a plain "not found" and never
// the page's frame): GET /fleet every 2 s, drawn in place, so the scroll position and
// the chosen window stay. Workers are Celery workers (a host and a main process);
// their slots are pool processes, each with the runs it owns; only live ones count.

const FLEET_REFRESH_MS = 2000;
const minutesChoice = document.getElementById("minutes");
const fleetError = document.getElementById("fleet-error");
let lastBody = null;

function seconds(value) {
  if (value === null || value === undefined) return "-";
  const abs = Math.abs(value);
  if (abs < 10) return `${value.toFixed(1)} s`;
  if (abs < 120) return `${Math.round(value)} s`;
  if (abs < 7200) return `${Math.round(value / 60)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

// A takeover's pause as the run page says it: one decimal (ms below a tenth).
function pauseText(value) {
  if (value === null || value === undefined) return "-";
  if (value < 0.1) return `${Math.round(value * 1000)} ms`;
  return seconds(value);
}

function since(iso, nowIso) {
  return seconds((new Date(nowIso) - new Date(iso)) / 1000);
}

function runLink(runId) {
  return el("a", { class: "run-link", href: `/ui/runs/${encodeURIComponent(runId)}` }, runId);
}

function tile(iconName, label, value, extra) {
  const box = el("div", { class: `tile ${extra || ""}`, "data-tile": label });
  const head = el("span", { class: "tile-label" });
  head.append(lineIcon(iconName), document.createTextNode(label));
  box.append(head, el("span", { class: "tile-value" }, value));
  return box;
}

function reconcileSweep(body) {
  return body.sweeps.find((sweep) => sweep.name === "reconcile");
}

function drawTiles(body) {
  const live = body.workers.filter((w) => w.alive);
  const status = body.runs_by_status;
  const sweep = reconcileSweep(body);
  const takeovers = Object.values(body.takeovers_by_cause).reduce((a, b) => a + b, 0);
  const waiting = body.queues.reduce((sum, q) => sum + (q.depth || 0), 0);
  document.getElementById("tiles").replaceChildren(
    tile("worker", "workers", String(live.length)),
    tile("busy", "slots busy", `${body.slots.busy}/${body.slots.live}`),
    tile("busy", "runs running", String(status.running || 0)),
    tile("queue", "runs queued", String(status.queued || 0)),
    tile("queue", "in the queues", body.broker === "ok" ? String(waiting) : "broker down",
      body.broker === "ok" ? "" : "bad"),
    tile("wait", "awaiting worker", String(body.awaiting_adoption.length),
      body.awaiting_adoption.length ? "warn" : ""),
    tile("clock", "expired leases", String(body.expired_leases), body.expired_leases ? "warn" : ""),
    tile("takeover", "takeovers", String(takeovers)),
    tile("stream", "open streams", String(body.open_streams.now)),
    tile("clock", "reconciled", sweep && sweep.seconds_ago !== null
      ? `${seconds(sweep.seconds_ago)} ago` : "not yet", `text${sweep && sweep.overdue ? " warn" : ""}`),
  );
}

function drawSweeps(body) {
  const rows = body.sweeps.map((sweep) => {
    const row = el("tr", { "data-sweep": sweep.name, "data-overdue": String(sweep.overdue) });
    const last = sweep.finished_at === null ? "never"
      : `${seconds(sweep.seconds_ago)} ago`;
    const state = el("td", { class: "sweep-state" });
    if (sweep.overdue) state.append(el("span", { class: "badge warn" }, "overdue"));
    else if (sweep.finished_at === null) state.append(el("span", { class: "badge" }, "not yet"));
    else state.append(el("span", { class: "badge ok" }, "on time"));
    row.append(el("td", { class: "mono" }, sweep.name), el("td", {}, seconds(sweep.every_seconds)),
      el("td", { class: "sweep-last" }, last), state);
    return row;
  });
  document.getElementById("sweeps").replaceChildren(...rows);
  const sweep = reconcileSweep(body);
  const warning = document.getElementById("beat-warning");
  warning.hidden = !sweep || !sweep.overdue;
  if (sweep && sweep.overdue) {
    warning.textContent = sweep.seconds_ago === null
      ? "The reconciler has never run: start beat (turnkeeper beat). Until it runs, runs whose worker died are not taken over."
      : `The reconciler last ran ${seconds(sweep.seconds_ago)} ago and runs every ` +
        `${seconds(sweep.every_seconds)}: beat or its control worker has stopped. Until it ` +
        "runs, runs whose lease ran out are not taken over.";
  }
}

function leaseCell(run, ttl) {
  const cell = el("span", { class: "lease" });
  const left = run.lease_seconds_left;
  if (left === null) {
    cell.textContent = "no lease";
    return cell;
  }
  const meter = el("span", { class: "lease-meter" });
  const fill = el("span", { class: `lease-fill${left < 0 ? " expired" : ""}` });
  fill.style.width = `${Math.max(0, Math.min(100, (left / ttl) * 100)).toFixed(0)}%`;
  meter.append(fill);
  cell.append(meter, el("span", { class: left < 0 ? "expired" : "" },
    left >= 0 ? `${seconds(left)} left` : `expired ${seconds(-left)} ago`));
  return cell;
}

function slotRow(slot, ttl) {
  const row = el("li", {
    class: `slot${slot.runs.length ? " busy" : ""}${slot.alive ? "" : " gone"}`,
    "data-slot": slot.worker_id, "data-pid": String(slot.pid),
  });
  const who = el("span", { class: "slot-who" });
  who.append(lineIcon(slot.runs.length ? "busy" : "idle", slot.runs.length ? "busy" : "idle"),
    el("span", { class: "mono" }, `pid ${slot.pid}`));
  row.append(who);
  if (!slot.runs.length) {
    row.append(el("span", { class: "slot-idle" }, slot.alive ? "idle" : "stopped"));
    return row;
  }
  const runs = el("span", { class: "slot-runs" });
  for (const run of slot.runs) {
    const item = el("span", { class: "owned", "data-owned-run": run.run_id });
    item.append(runLink(run.run_id),
      el("span", { class: "meta" }, `epoch ${run.epoch}`),
      el("span", { class: "meta" }, `held ${seconds(run.held_seconds)}`),
      leaseCell(run, ttl));
    runs.append(item);
  }
  row.append(runs);
  return row;
}

function workerCard(worker, body) {
  const card = el("article", {
    class: `worker${worker.alive ? "" : " gone"}`,
    "data-worker": `${worker.host_id}:${worker.main_pid}`,
    "data-main-pid": String(worker.main_pid), "data-alive": String(worker.alive),
  });
  const head = el("div", { class: "worker-head" });
  const name = el("span", { class: "worker-name" });
  name.append(lineIcon(worker.alive ? "worker" : "stopped"),
    el("strong", {}, worker.host_id), el("span", { class: "mono" }, `worker ${worker.main_pid}`));
  head.append(name);
  if (worker.draining) head.append(el("span", { class: "badge warn" }, "draining"));
  // Alive (for routing) until host_dead_after; quiet for three beats already says more.
  if (worker.alive && worker.silent_seconds > 3 * body.beat_interval) {
    head.append(el("span", { class: "badge warn", "data-silent": "true" }, "not beating"));
  }
  const stopped = worker.slots.length - worker.slots_live;
  const slotsText = `${worker.slots_busy}/${worker.slots_live} slots busy` +
    (stopped ? ` · ${stopped} stopped` : "");
  const beat = `last heartbeat ${seconds(worker.silent_seconds)} ago`;
  head.append(el("span", { class: "meta" }, worker.alive
    ? `${slotsText} · up ${since(worker.started_at, body.now)} · ${beat}`
    : `${worker.slots.length} slots · stopped: ${beat}`));
  const slots = el("ul", { class: "slots" });
  slots.append(...worker.slots.map((slot) => slotRow(slot, body.lease_ttl)));
  card.append(head, slots);
  return card;
}

function drawWorkers(body) {
  const live = body.workers.filter((w) => w.alive);
  const gone = body.workers.filter((w) => !w.alive);
  const box = document.getElementById("workers");
  box.replaceChildren(...live.map((w) => workerCard(w, body)));
  if (!live.length) box.append(el("p", { class: "empty-note" }, "No worker is running: queued runs wait."));
  document.getElementById("workers-hint").textContent =
    `A worker is alive while one of its processes beat within ${seconds(body.host_dead_after)}; ` +
    `leases last ${seconds(body.lease_ttl)}.`;
  document.getElementById("stopped-workers").replaceChildren(...gone.map((w) => workerCard(w, body)));
  document.getElementById("stopped-panel").hidden = gone.length === 0;
}

function drawQueues(body) {
  const rows = body.queues.map((queue) => {
    const row = el("tr", { "data-queue": queue.name, "data-kind": queue.kind });
    const name = el("td", { class: "mono" });
    name.append(lineIcon("queue"), document.createTextNode(` ${queue.name}`));
    const serves = { turns: "new runs and takeovers", control: "reconcile, reap, prune" }[queue.kind]
      || `runs and takeovers for host ${queue.host_id}`;
    const depth = queue.depth === null ? (body.broker === "ok" ? "not declared" : "unknown") : String(queue.depth);
    row.append(name, el("td", {}, serves), el("td", { class: "num depth" }, depth));
    return row;
  });
  document.getElementById("queues").replaceChildren(...rows);
  const adoption = document.getElementById("adoption");
  adoption.replaceChildren();
  if (body.awaiting_adoption.length) {
    adoption.append(el("h3", {}, "Handed over, awaiting a worker"));
    const list = el("ul", { class: "awaiting" });
    for (const run of body.awaiting_adoption) {
      const item = el("li", { "data-awaiting": run.run_id });
      item.append(lineIcon("wait"), runLink(run.run_id),
        el("span", { class: "meta" }, `epoch ${run.epoch} · waiting ${seconds(run.waiting_seconds)}`));
      list.append(item);
    }
    adoption.append(list);
  }
}

function minuteLabel(iso) {
  const at = new Date(iso);
  return `${String(at.getHours()).padStart(2, "0")}:${String(at.getMinutes()).padStart(2, "0")}`;
}

// A time label under about every 70 px of chart.
function minuteTicks(labels, box) {
  const width = Math.max(240, box.clientWidth || 0);
  const every = Math.max(1, Math.ceil(labels.length / Math.max(2, Math.floor(width / 70))));
  return (i) => ((labels.length - 1 - i) % every === 0 ? labels[i] : null);
}

// The runs table, filtered to the runs of one outcome that finished within a window.
function runsLink(status, since, until) {
  const query = new URLSearchParams({
    status, finished_since: new Date(since).toISOString(), finished_until: new Date(until).toISOString(),
  });
  return `/?${query}`;
}

function drawCharts(body) {
  const labels = body.activity.map((m) => minuteLabel(m.minute));
  const runsBox = document.getElementById("chart-runs");
  const minutes = body.activity.map((m) => new Date(m.minute).getTime());
  const windowEnd = minutes.length ? minutes[minutes.length - 1] + 60_000 : 0;
  barChart(runsBox, {
    labels,
    tick: minuteTicks(labels, runsBox),
    series: ["completed", "failed", "aborted"].map((outcome) => ({
      key: outcome, name: outcome, values: body.activity.map((m) => m.settled[outcome] || 0),
      href: (i) => runsLink(outcome, minutes[i], minutes[i] + 60_000),
      legendHref: minutes.length ? runsLink(outcome, minutes[0], windowEnd) : null,
    })),
    line: { key: "started", name: "started", values: body.activity.map((m) => m.started) },
    empty: "no run started or settled",
  });
  const takeoverBox = document.getElementById("chart-takeovers");
  barChart(takeoverBox, {
    labels,
    tick: minuteTicks(labels, takeoverBox),
    series: [["crash", "crash"], ["lease", "lease expired"], ["forced", "forced"]].map(([cause, name]) => ({
      key: cause, name, values: body.activity.map((m) => m.takeovers[cause] || 0),
    })),
    empty: "no takeover",
  });
  const latency = body.takeover_latency;
  const bucketLabels = latency.buckets.map((b, i) =>
    b.le === null ? `≥${latency.buckets[i - 1].le}` : `<${b.le}`);
  const latencyBox = document.getElementById("chart-latency");
  barChart(latencyBox, {
    labels: bucketLabels.map((l) => `${l} s`),
    tick: (i) => bucketLabels[i],
    series: [{
      key: "latency",
      name: "takeovers",
      values: latency.buckets.map((b) => b.count),
      legend: latency.count
        ? `${latency.count} takeover${latency.count === 1 ? "" : "s"} · median ${pauseText(latency.p50)} · p95 ${pauseText(latency.p95)} · max ${pauseText(latency.max)}`
        : "no takeover adopted in this window",
    }],
    empty: "no takeover",
  });
  const streamsBox = document.getElementById("chart-streams");
  const streamLabels = body.open_streams.per_minute.map((m) => minuteLabel(m.minute));
  barChart(streamsBox, {
    labels: streamLabels,
    tick: minuteTicks(streamLabels, streamsBox),
    series: [],
    line: {
      key: "streams", name: "open streams",
      values: body.open_streams.per_minute.map((m) => m.peak),
      legend: `open now ${body.open_streams.now}`,
    },
  });
}

function draw(body) {
  lastBody = body;
  drawTiles(body);
  drawWorkers(body);
  drawQueues(body);
  drawSweeps(body);
  drawCharts(body);
  document.getElementById("fleet").dataset.loaded = "true";
}

async function refreshFleet() {
  try {
    const body = await getJSON(`/fleet?minutes=${encodeURIComponent(minutesChoice.value)}`);
    draw(body);
    fleetError.hidden = true;
    document.getElementById("refreshed").textContent = `refreshed ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (error.status === 403) {  // the key is no admin's (any more)
      notForThisKey();
      return false;
    }
    fleetError.hidden = false;
    fleetError.textContent = `refresh failed: ${error.message}`;
    document.getElementById("refreshed").textContent = "refresh failed";
  }
  return true;
}

function notForThisKey() {
  document.getElementById("refreshed").hidden = true;
  showNotFound("There is no fleet page for this key: it needs an admin key.");
}

async function loop() {
  if (await refreshFleet()) setTimeout(loop, FLEET_REFRESH_MS);
}

async function startFleet() {
  let key;
  try {
    key = await showIdentity();
  } catch (error) {
    document.getElementById("refreshed").textContent = `refresh failed: ${error.message}`;
    setTimeout(startFleet, FLEET_REFRESH_MS);
    return;
  }
  if (!key.admin) {
    notForThisKey();
    return;
  }
  document.getElementById("fleet").hidden = false;
  loop();
}

minutesChoice.addEventListener("change", () => refreshFleet());
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { if (lastBody) drawCharts(lastBody); }, 150);
});

if (apiKey()) startFleet();
