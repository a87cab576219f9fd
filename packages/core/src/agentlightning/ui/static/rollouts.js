// Rollouts: a filtered, paginated table answered by the store (POST /v1/rollouts/list), one page at a time.

import { badge, fmtDuration, fmtNum, fmtTime, h, post, routeTo } from "./lib.js";

const STATUSES = ["queuing", "running", "succeeded", "failed", "cancelled"];
const MODES = ["train", "val", "test"];

function queryFrom(params) {
  const q = { limit: Number(params.get("size") || 50), offset: 0 };
  q.offset = Number(params.get("page") || 0) * q.limit;
  const status = params.getAll("status").filter((s) => STATUSES.includes(s));
  if (status.length) q.status = status;
  const mode = params.get("mode");
  if (mode && MODES.includes(mode)) q.mode = [mode];
  if (params.get("group")) q.group_id = params.get("group");
  if (params.get("search")) q.search = params.get("search");
  if (params.get("version") !== null && params.get("version") !== "") q.model_version = Number(params.get("version"));
  return q;
}

function filterForm(params) {
  const checks = STATUSES.map((s) => h("label", {},
    h("input", { type: "checkbox", name: "status", value: s, checked: params.getAll("status").includes(s) }), " ", s));
  const mode = h("select", { name: "mode", id: "filter-mode" }, h("option", { value: "" }, "any"),
    MODES.map((m) => h("option", { value: m, selected: params.get("mode") === m }, m)));
  const size = h("select", { name: "size", id: "page-size" },
    [25, 50, 100, 200].map((n) => h("option", { value: n, selected: Number(params.get("size") || 50) === n }, n)));
  const form = h("form", { class: "filters", id: "rollout-filters" },
    h("fieldset", { class: "checks status-filter" }, h("legend", {}, "status"), checks),
    h("div", {}, h("label", { class: "t", for: "filter-mode" }, "mode"), mode),
    h("div", {}, h("label", { class: "t", for: "filter-group" }, "group"),
      h("input", { type: "text", name: "group", id: "filter-group", value: params.get("group") || "", size: 16 })),
    h("div", {}, h("label", { class: "t", for: "filter-version" }, "model version"),
      h("input", { type: "number", name: "version", id: "filter-version", min: 0, value: params.get("version") || "", style: "width:6rem" })),
    h("div", {}, h("label", { class: "t", for: "filter-search" }, "id contains"),
      h("input", { type: "text", name: "search", id: "filter-search", value: params.get("search") || "", size: 18 })),
    h("div", {}, h("label", { class: "t", for: "page-size" }, "rows"), size),
    h("button", { type: "submit", class: "primary", id: "apply-filters" }, "Apply"));
  const apply = (event) => {
    if (event) event.preventDefault();
    const next = new URLSearchParams();
    for (const [key, value] of new FormData(form).entries()) if (value !== "") next.append(key, String(value));
    routeTo(["rollouts"], next);
  };
  form.addEventListener("submit", apply);
  for (const el of form.querySelectorAll("input[type=checkbox], select")) el.addEventListener("change", apply);
  return form;
}

function row(r) {
  const open = () => routeTo(["rollout", r.rollout_id], null);
  return h("tr", { class: "clickable", dataset: { rolloutId: r.rollout_id, status: r.status }, onclick: open },
    h("td", { class: "mono" }, h("a", { href: "#/rollout/" + encodeURIComponent(r.rollout_id) }, r.rollout_id)),
    h("td", {}, badge(r.status)),
    h("td", {}, r.mode || "—"),
    h("td", { class: "mono" }, r.group_id || "—"),
    h("td", { class: "num" }, fmtNum(r.reward)),
    h("td", { class: "num" }, r.attempts),
    h("td", { class: "num" }, fmtDuration(r.duration)),
    h("td", { class: "num" }, r.model_version ?? "—"),
    h("td", { class: "err-cell", title: r.error || "" }, r.error || ""),
    h("td", {}, fmtTime(r.created_at)));
}

export async function renderRollouts(view, _path, params, isStale, loaded) {
  performance.clearMarks("rollouts-start");
  performance.clearMeasures("rollouts-render");
  performance.mark("rollouts-start");
  const query = queryFrom(params);
  view.append(h("h1", {}, "Rollouts"), filterForm(params));
  const page = await post("/v1/rollouts/list", query);
  if (isStale()) return;
  performance.mark("rollouts-fetched");
  const pages = Math.max(1, Math.ceil(page.total / page.limit));
  const current = Math.floor(page.offset / page.limit);
  const go = (n) => {
    const next = new URLSearchParams(params);
    next.set("page", String(n));
    routeTo(["rollouts"], next);
  };
  const first = page.total ? page.offset + 1 : 0;
  const pager = h("div", { class: "pager" },
    h("button", { type: "button", class: "plain", id: "prev-page", disabled: current <= 0, onclick: () => go(current - 1) }, "← Prev"),
    h("span", { id: "page-info" }, `${first}–${page.offset + page.rollouts.length} of ${page.total} · page ${current + 1} of ${pages}`),
    h("button", { type: "button", class: "plain", id: "next-page", disabled: current + 1 >= pages, onclick: () => go(current + 1) }, "Next →"));
  const table = h("table", { id: "rollouts-table", dataset: { total: page.total } },
    h("thead", {}, h("tr", {}, ["rollout", "status", "mode", "group", "reward", "attempts", "duration", "version", "error", "created"]
      .map((t, i) => h("th", { class: [4, 5, 6, 7].includes(i) ? "num" : null }, t)))),
    h("tbody", {}, page.rollouts.length ? page.rollouts.map(row)
      : h("tr", {}, h("td", { colspan: 10, class: "muted" }, "no rollout matches"))));
  view.append(pager, table);
  void table.offsetHeight; // lay the table out now, so the measure below includes style and layout
  performance.measure("rollouts-render", "rollouts-start");
  loaded();
}
