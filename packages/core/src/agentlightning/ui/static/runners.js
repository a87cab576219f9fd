// Runs, per runner process: the attempts each claimed and how they ended (`RunStats.workers`, one row per worker
// id, grouped here per process). `agl runner` claims under host:pid:index, so local runners, runners started by hand
// on other machines and runners placed by Ray all show, by host and pid (a Ray runner's pid is the one `agl train`
// prints as `ray runner I: node ... host ... pid ...`).

import { fmtTime, h } from "./lib.js";

// "host:pid" of "host:pid:index"; any other worker id is its own runner
export function runnerOf(workerId) {
  const i = workerId.lastIndexOf(":");
  return i > 0 && /^\d+$/.test(workerId.slice(i + 1)) ? workerId.slice(0, i) : workerId;
}

export function runnerRows(workers) {
  const runners = new Map();
  for (const w of workers) {
    const key = runnerOf(w.worker_id);
    const r = runners.get(key) || { key, workers: 0, attempts: 0, running: 0, succeeded: 0, failed: 0, timed_out: 0, cancelled: 0, last: null };
    r.workers += 1;
    for (const f of ["attempts", "running", "succeeded", "failed", "timed_out", "cancelled"]) r[f] += w[f];
    if (w.last_start !== null) r.last = r.last === null ? w.last_start : Math.max(r.last, w.last_start);
    runners.set(key, r);
  }
  return [...runners.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

// [heading, table] for the runs page
export function runnerTable(stats) {
  const rows = runnerRows(stats.workers || []).map((r) => {
    const cut = r.key.lastIndexOf(":");
    const [host, pid] = cut > 0 ? [r.key.slice(0, cut), r.key.slice(cut + 1)] : [r.key, "—"];
    return h("tr", { "data-runner": r.key },
      h("td", {}, host), h("td", { class: "num" }, pid), h("td", { class: "num" }, r.workers),
      h("td", { class: "num" }, r.attempts), h("td", { class: "num" }, r.running), h("td", { class: "num" }, r.succeeded),
      h("td", { class: "num" }, r.failed), h("td", { class: "num" }, r.timed_out), h("td", { class: "num" }, r.cancelled),
      h("td", {}, fmtTime(r.last)));
  });
  const table = h("table", { id: "runners-table" },
    h("thead", {}, h("tr", {}, ["host", "pid", "workers", "claimed", "running", "succeeded", "failed", "timed out", "cancelled", "last claim"]
      .map((t, i) => h("th", { class: i >= 1 && i <= 8 ? "num" : null }, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 10, class: "muted" }, "no attempt claimed yet"))));
  return [h("h2", {}, "Per runner"), table];
}
