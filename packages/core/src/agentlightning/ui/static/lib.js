// Small helpers shared by every view: DOM building (text only, never innerHTML), the API client, formatting.

export const TOKEN_KEY = "agentlightning.store.token";

export class AuthError extends Error {}
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// h("td", {class: "num"}, "1.0", child...) -> element; strings become text nodes (so data is never parsed as HTML).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    // through CSSOM: the page's Content-Security-Policy refuses inline style attributes
    else if (key === "style") el.style.cssText = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  let data = null;
  try {
    data = await resp.json();
  } catch (_) {
    data = null;
  }
  if (resp.status === 401) throw new AuthError((data && data.message) || "unauthorized");
  if (!resp.ok) throw new ApiError(resp.status, (data && data.message) || resp.statusText);
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body || {});

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined) return "—";
  if (Number.isInteger(x)) return String(x);
  return Number(x).toFixed(digits);
}

export function fmtPct(x) {
  return x === null || x === undefined ? "—" : (100 * x).toFixed(1) + "%";
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return (seconds * 1000).toFixed(0) + " ms";
  if (seconds < 120) return seconds.toFixed(2) + " s";
  return (seconds / 60).toFixed(1) + " min";
}

export function fmtTime(epoch) {
  if (!epoch) return "—";
  const d = new Date(epoch * 1000);
  return d.toLocaleString(undefined, { hour12: false });
}

export function badge(text, kind) {
  return h("span", { class: "badge " + (kind || text || "") }, text === null || text === undefined ? "—" : text);
}

export function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch (_) {
    return String(value);
  }
}

// The hash route: "#/rollouts?status=failed" -> {path: ["rollouts"], params: URLSearchParams}
export function currentRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?", 2);
  return { path: path ? path.split("/").map(decodeURIComponent) : [], params: new URLSearchParams(query || "") };
}

// The view's load state, which readers (tests, benchmarks) wait on: main#view's data-loaded is the address (hash) of
// the route whose data is drawn, and is absent while a view, or a new load of it, is on its way. Each load takes a
// sequence number: a load that an earlier one overtook (a slow response to an old filter) never marks the view loaded.
let loadSeq = 0;

function unload() {
  loadSeq += 1;
  const view = document.getElementById("view");
  if (view) delete view.dataset.loaded;
}

// Starts a load of `view` for the current address; returns the function that marks it drawn (a no-op once a later
// load started).
export function startLoad(view) {
  unload();
  const seq = loadSeq;
  const hash = location.hash || "#/";
  return () => {
    if (seq === loadSeq) view.dataset.loaded = hash;
  };
}

export function routeTo(path, params) {
  const query = params && [...params.keys()].length ? "?" + params.toString() : "";
  const hash = "#/" + path.map(encodeURIComponent).join("/") + query;
  if (location.hash === hash) return;
  // the hashchange event that draws the new route comes later: until then the old rows are not the new route's
  unload();
  location.hash = hash;
}
