"use strict";
// Helpers shared by the pages. No framework, no build step.
//
// The API key the user gave the login page lives in sessionStorage (this tab only,
// gone when it closes). Every API call sends it; a 401 (no key, a wrong or revoked
// one) sends the user back to the login page.

const KEY_STORAGE = "turnkeeper.key";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function leaseText(run) {
  if (run.lease_seconds_left === null || run.lease_seconds_left === undefined) return "-";
  const left = run.lease_seconds_left;
  return left >= 0 ? `${left.toFixed(1)}s left` : `expired ${(-left).toFixed(1)}s ago`;
}

function shortTime(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "-";
}

function toLogin() {
  sessionStorage.removeItem(KEY_STORAGE);
  const next = encodeURIComponent(location.pathname + location.search);
  location.replace(`/login?next=${next}`);
}

function apiKey() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (!key) toLogin();
  return key;
}

async function getJSON(url) {
  const key = apiKey();
  if (!key) throw new Error("not signed in");
  const response = await fetch(url, {
    cache: "no-store",
    headers: { Authorization: `Bearer ${key}` },
  });
  if (response.status === 401) {
    toLogin();
    throw new Error("the key was refused");
  }
  const body = await response.json();
  if (!response.ok) {
    const refused = new Error(body.error || `HTTP ${response.status}`);
    refused.status = response.status;  // a page may say more about a 404 than its text
    throw refused;
  }
  return body;
}

let keyAsked = null;

// The key this tab signed in with (GET /key), asked once per page.
function signedInKey() {
  if (keyAsked === null) {
    keyAsked = getJSON("/key");
    keyAsked.catch(() => { keyAsked = null; });
  }
  return keyAsked;
}

// The header's "key NAME" and sign-out link; the links an admin key's pages only
// (data-admin-only: the fleet page) stay hidden for any other key.
async function showIdentity() {
  const key = await signedInKey();
  for (const link of document.querySelectorAll("[data-admin-only]")) link.hidden = !key.admin;
  const who = document.getElementById("who");
  if (!who) return key;
  who.textContent = `key ${key.name}${key.admin ? " (admin: every run)" : ""}`;
  const out = el("a", { href: "/login", id: "sign-out" }, "sign out");
  out.addEventListener("click", () => sessionStorage.removeItem(KEY_STORAGE));
  who.after(out);
  return key;
}

// Instead of a page's content, a plain "not found": nothing of the page's own (its
// tables, its buttons) is left to suggest there is something behind it.
function showNotFound(text) {
  for (const main of document.querySelectorAll("main")) main.hidden = true;
  const box = el("main", { id: "not-found", class: "not-found" });
  box.append(el("h2", {}, "Not found"), el("p", { dir: "auto" }, text));
  const back = el("p");
  back.append(el("a", { href: "/" }, "back to the runs"));
  box.append(back);
  document.querySelector("header").after(box);
  document.title = "turnkeeper: not found";
}

// --- words for what the API says in codes ------------------------------------------

// A run's error in words ("agent-exit: the agent exited with code 2"), never as JSON.
function errorText(error) {
  if (error === null || error === undefined) return "";
  if (typeof error !== "object") return String(error);
  const reason = typeof error.reason === "string" ? error.reason : "";
  const message = typeof error.message === "string" ? error.message : "";
  if (reason && message) return `${reason}: ${message}`;
  return reason || message || "the run failed";
}

// What a running run's turn is doing, from its turn slot's phase.
const PHASES = {
  before_provider: "starting the agent",
  provider_started: "the agent is working",
  tool_request_recorded: "waiting for a tool call",
  committed: "turn saved",
};

function phaseText(run) {
  if (run.status !== "running" || !run.phase) return null;
  const words = PHASES[run.phase] || run.phase;
  return run.turn_index === null || run.turn_index === undefined
    ? words : `turn ${run.turn_index + 1}: ${words}`;
}

// 4.2 s, 42 s, 3 min 12 s, 2 h 5 min.
function durationText(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

function pad2(n) {
  return String(n).padStart(2, "0");
}

// 14:03:12 today; Dec 3 14:03 another day (the local clock, 24 hours).
function whenText(iso) {
  if (!iso) return "-";
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso);  // not a time: as it was given
  const now = new Date();
  const clock = `${pad2(at.getHours())}:${pad2(at.getMinutes())}`;
  if (at.toDateString() === now.toDateString()) return `${clock}:${pad2(at.getSeconds())}`;
  const month = at.toLocaleString("en-US", { month: "short" });
  return `${month} ${at.getDate()} ${clock}`;
}

// An owner id (host:pid:token) that breaks only after its colons, never mid-name.
function ownerNode(owner) {
  const node = el("span", { class: "owner-id", title: owner || "" });
  if (!owner) {
    node.textContent = "-";
    return node;
  }
  String(owner).split(":").forEach((part, i, parts) => {
    node.append(document.createTextNode(i < parts.length - 1 ? `${part}:` : part));
    if (i < parts.length - 1) node.append(document.createElement("wbr"));
  });
  return node;
}

// --- icons: inline SVG, drawn with the text's colour; no emoji font needed ----------

const SVG_NS = "http://www.w3.org/2000/svg";
const ICONS = {
  tool: "M10.5 1.8a3.7 3.7 0 0 0-3.5 4.9L1.9 11.8a1.5 1.5 0 0 0 2.1 2.1l5.1-5.1a3.7 3.7 0 0 0 4.9-4.6l-2.2 2.2-1.9-.4-.4-1.9 2.2-2.2a3.7 3.7 0 0 0-1.2-.1z",
  result: "M3 2.5v5a3 3 0 0 0 3 3h7.5M10.5 7.5l3 3-3 3",
  start: "M5 2.8v10.4l8.2-5.2z",
  done: "M2.8 8.6l3.4 3.4 7-7.6",
  error: "M4 4l8 8M12 4l-8 8",
  takeover: "M13.2 6.2A5.4 5.4 0 0 0 3 5.4M2.8 9.8A5.4 5.4 0 0 0 13 10.6M3 1.8v3.6h3.6M13 14.2v-3.6H9.4",
  interrupted: "M5.5 3v10M10.5 3v10",
  stop: "M4 4h8v8H4z",
  user: "M8 8.2a3 3 0 1 0 0-6 3 3 0 0 0 0 6zM2.5 14.5a5.5 5.5 0 0 1 11 0",
  agent: "M3 4.5h10v8H3zM8 4.5V2M6 8h.01M10 8h.01M1.5 8v2M14.5 8v2",
  usage: "M3 13.5V9M8 13.5V3.5M13 13.5V6.5",
  info: "M8 14.5A6.5 6.5 0 1 0 8 1.5a6.5 6.5 0 0 0 0 13zM8 7.3v4M8 4.8v.01",
  branch: "M4.5 2.5v11M4.5 9.5c0-3 7-2 7-5M11.5 2.5v2",
  raw: "M5.5 3.5L2 8l3.5 4.5M10.5 3.5L14 8l-3.5 4.5",
};
const FILLED_ICONS = new Set(["start", "stop"]);

function icon(name) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("class", `icon icon-${name}`);
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "16");
  svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(SVG_NS, "path");
  path.setAttribute("d", ICONS[name] || ICONS.info);
  if (FILLED_ICONS.has(name)) {
    path.setAttribute("fill", "currentColor");
  } else {
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", "currentColor");
    path.setAttribute("stroke-width", "1.6");
    path.setAttribute("stroke-linecap", "round");
    path.setAttribute("stroke-linejoin", "round");
  }
  svg.append(path);
  return svg;
}

// An element that starts with an icon (its text: only the text, never the icon's).
function withIcon(tag, attrs, name, text) {
  const node = el(tag, attrs);
  node.append(icon(name));
  if (text !== undefined && text !== null) node.append(document.createTextNode(String(text)));
  return node;
}

function statusPill(status) {
  return el("span", { class: `status ${status}` }, status);
}

function fullTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

async function postJSON(url) {
  const key = apiKey();
  if (!key) throw new Error("not signed in");
  const response = await fetch(url, {
    method: "POST",
    cache: "no-store",
    headers: { Authorization: `Bearer ${key}` },
  });
  if (response.status === 401) {
    toLogin();
    throw new Error("the key was refused");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}
