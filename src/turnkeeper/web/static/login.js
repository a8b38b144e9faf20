"use strict";
// The login page: check the key against the API, keep it for this tab, go on.

const form = document.getElementById("login");
const problem = document.getElementById("login-error");

function nextPage() {
  const next = new URLSearchParams(location.search).get("next") || "/";
  // Only a page of this site, never an open redirect. The browser's own URL parser
  // decides: it reads "/\\host" and "/<tab>/host" as "//host", another site.
  let target;
  try {
    target = new URL(next, location.origin);
  } catch {
    return "/";
  }
  if (target.origin !== location.origin) return "/";
  return target.pathname + target.search + target.hash;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = document.getElementById("key").value.trim();
  problem.textContent = "";
  const response = await fetch("/key", {
    cache: "no-store",
    headers: { Authorization: `Bearer ${key}` },
  });
  if (!response.ok) {
    problem.textContent = response.status === 401
      ? "This key is unknown or revoked." : `The API answered ${response.status}.`;
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  location.replace(nextPage());
});
