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

async function showIdentity() {
  const who = document.getElementById("who");
  if (!who) return;
  const key = await getJSON("/key");
  who.textContent = `key ${key.name}${key.admin ? " (admin: every run)" : ""}`;
  const out = el("a", { href: "/login", id: "sign-out" }, "sign out");
  out.addEventListener("click", () => sessionStorage.removeItem(KEY_STORAGE));
  who.after(out);
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
