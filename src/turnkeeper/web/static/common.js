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
