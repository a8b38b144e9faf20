"use strict";
// Helpers shared by the two pages. No framework, no build step.

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

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}
