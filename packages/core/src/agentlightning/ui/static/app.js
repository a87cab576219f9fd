// The dashboard shell: login (token in sessionStorage, sent as a bearer header) and routing.
// The address agl store serve / agl train print carries the token in its fragment (#token=...): a browser never sends
// a fragment to the server (nor in a Referer). The page moves it to sessionStorage and out of the address bar.

import { AuthError, TOKEN_KEY, clear, currentRoute, get, h, startLoad } from "./lib.js";
import { renderHealth } from "./health.js";
import { renderResources } from "./resources.js";
import { renderRollout } from "./rollout.js";
import { renderRollouts } from "./rollouts.js";
import { renderRuns } from "./runs.js";

const VIEWS = { runs: renderRuns, rollouts: renderRollouts, rollout: renderRollout, resources: renderResources, health: renderHealth };
const $ = (id) => document.getElementById(id);
let cleanup = null;
let generation = 0;

function showLogin(message) {
  if (cleanup) cleanup();
  cleanup = null;
  clear($("view"));
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  const error = $("login-error");
  error.textContent = message || "";
  error.hidden = !message;
  document.body.dataset.state = "login";
  $("token").focus();
}

function showApp() {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  document.body.dataset.state = "app";
}

// Ask the store something cheap: 401 means no or wrong token.
async function checkAccess() {
  const stats = await get("/v1/stats");
  const total = Object.values(stats.rollouts).reduce((a, b) => a + b, 0);
  $("store-status").textContent = `${total} rollouts · ${stats.spans} spans · ${stats.llm_calls} LLM calls`;
  return stats;
}

async function route() {
  const { path, params } = currentRoute();
  const name = VIEWS[path[0]] ? path[0] : "runs";
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === name || (name === "rollout" && a.dataset.view === "rollouts"));
  }
  if (cleanup) cleanup();
  cleanup = null;
  const mine = ++generation;
  const view = clear($("view"));
  const loaded = startLoad(view); // the view calls it once it has drawn this route's data
  view.dataset.view = name;
  try {
    cleanup = (await VIEWS[name](view, path.slice(1), params, () => mine !== generation, loaded)) || null;
  } catch (err) {
    if (err instanceof AuthError) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("The store refused the token; log in again.");
      return;
    }
    if (mine === generation) view.append(h("p", { class: "error", id: "view-error" }, String(err.message || err)));
  }
}

// "#token=..." -> sessionStorage; the address bar (and the tab's history) keeps the page without it.
function takeTokenFromUrl() {
  const match = /^#token=([^&]*)$/.exec(location.hash);
  if (!match) return false;
  const token = decodeURIComponent(match[1]).trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}

async function start() {
  try {
    await checkAccess();
  } catch (err) {
    if (err instanceof AuthError) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(null);
      return;
    }
    $("view").append(h("p", { class: "error" }, "Cannot reach the store: " + err.message));
    return;
  }
  showApp();
  await route();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("login-submit").disabled = true;
  try {
    await checkAccess();
    $("token").value = "";
    showApp();
    await route();
  } catch (err) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(err instanceof AuthError ? "Wrong token: the store refused it." : "Cannot reach the store: " + err.message);
  } finally {
    $("login-submit").disabled = false;
  }
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(null);
});

window.addEventListener("hashchange", () => {
  if (takeTokenFromUrl()) start(); // a new address with a token pasted into an open tab
  else if (document.body.dataset.state === "app") route();
});

takeTokenFromUrl();
start();
