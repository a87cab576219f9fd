// Runs: what training looks like right now, refreshed live. Reward mean and success rate per model version
// (one line per rollout mode), throughput, failed / timed-out counts, one reward curve per policy (policies.js), and
// the attempts of each runner process (runners.js).

import { COLORS, barChart, lineChart } from "./chart.js";
import { clear, fmtNum, fmtPct, fmtTime, h, post, startLoad } from "./lib.js";
import { policyPanel } from "./policies.js";
import { runnerTable } from "./runners.js";

const REFRESH_MS = 3000;

function legend(names) {
  return h("div", { class: "legend" }, names.map((n, i) => h("span", {}, h("i", { style: `background:${COLORS[i]}` }), n)));
}

function card(label, value, id) {
  return h("div", { class: "card", id }, h("div", { class: "n" }, value), h("div", { class: "l" }, label));
}

function rate(stats) {
  // finished attempts per second over the last minute of complete-or-current buckets
  const n = Math.max(1, Math.round(60 / stats.bucket));
  const recent = stats.throughput.slice(-n);
  if (!recent.length) return 0;
  const seconds = Math.max(1e-9, stats.now - recent[0].start);
  return recent.reduce((a, b) => a + b.finished, 0) / seconds;
}

function perMode(stats, field) {
  const modes = [...new Set(stats.versions.map((v) => v.mode || "none"))];
  const series = modes.map((mode) => ({
    name: mode,
    points: stats.versions
      .filter((v) => (v.mode || "none") === mode && v.model_version !== null && v[field] !== null)
      .map((v) => ({ x: v.model_version, y: v[field], title: `${mode} · version ${v.model_version}: ${fmtNum(v[field])} (${v.rewarded} rewarded)` })),
  }));
  return series.filter((se) => se.points.length);
}

function draw(root, stats) {
  const timedOut = (stats.attempts.timeout || 0) + (stats.attempts.unresponsive || 0);
  const cards = h("div", { class: "cards", id: "run-cards" },
    ["queuing", "running", "succeeded", "failed", "cancelled"].map((s) => card(s + " rollouts", stats.rollouts[s] || 0, "card-" + s)),
    card("failed attempts", stats.attempts.failed || 0, "card-failed-attempts"),
    card("timed-out attempts", timedOut, "card-timed-out"),
    card("rollouts / s (last min)", rate(stats).toFixed(2), "card-rate"),
  );
  const reward = perMode(stats, "reward_mean");
  const success = perMode(stats, "success_rate");
  const charts = h("div", { class: "grid2" },
    h("div", { class: "card chart", id: "chart-reward" }, h("h2", {}, "Reward mean per model version"),
      lineChart(reward, { xLabel: "model version", integerX: true, title: "reward mean" }), legend(reward.map((r) => r.name))),
    h("div", { class: "card chart", id: "chart-success" }, h("h2", {}, `Success rate (reward ≥ ${stats.success_reward})`),
      lineChart(success, { xLabel: "model version", integerX: true, yMin: 0, yMax: 1, title: "success rate" }),
      legend(success.map((r) => r.name))),
    h("div", { class: "card chart", id: "chart-throughput" }, h("h2", {}, `Attempts finished per ${stats.bucket} s`),
      barChart(stats.throughput.map((b) => ({
        x: new Date(b.start * 1000).toLocaleTimeString(undefined, { hour12: false }),
        values: [b.finished - b.failed, b.failed],
      })), ["succeeded", "not succeeded"], { colors: ["#16a34a", "#b91c1c"], title: "throughput" }),
      legend(["succeeded", "not succeeded"])),
  );
  const rows = stats.versions.map((v) => h("tr", {},
    h("td", { class: "num" }, v.model_version ?? "—"), h("td", {}, v.mode || "—"),
    h("td", { class: "num" }, v.attempts), h("td", { class: "num" }, v.succeeded), h("td", { class: "num" }, v.failed),
    h("td", { class: "num" }, v.timed_out), h("td", { class: "num" }, fmtNum(v.reward_mean)),
    h("td", { class: "num" }, fmtPct(v.success_rate)), h("td", {}, fmtTime(v.last_end))));
  const table = h("table", { id: "versions-table" },
    h("thead", {}, h("tr", {}, ["version", "mode", "attempts", "succeeded", "failed", "timed out", "reward mean", "success", "last finished"]
      .map((t, i) => h("th", { class: i >= 2 && i <= 7 ? "num" : null }, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no finished attempts yet"))));
  const policies = policyPanel(stats);
  charts.append(policies.chart);
  clear(root).append(cards, charts, h("h2", {}, "Per model version"), table, ...policies.table, ...runnerTable(stats),
    h("p", { class: "muted", id: "runs-updated" }, "updated " + fmtTime(stats.now)));
}

export async function renderRuns(view, _path, params, isStale, loaded) {
  let threshold = Number(params.get("success") || "1");
  const input = h("input", { type: "number", step: "any", value: threshold, id: "success-threshold", style: "width:6rem" });
  const body = h("div", { id: "runs-body" });
  view.append(h("h1", {}, "Runs"),
    h("div", { class: "controls" }, h("div", {}, h("label", { for: "success-threshold" }, "success means reward ≥"), input)),
    body);
  let timer = null;
  let stopped = false;
  async function refresh() {
    timer = null;
    if (stopped || isStale()) return;
    const stats = await post("/v1/runs/stats", { success_reward: threshold, window: 300, bucket: 10 });
    if (stopped || isStale()) return;
    draw(body, stats);
    loaded();
    if (!document.hidden) timer = setTimeout(() => refresh().catch(() => {}), REFRESH_MS);
  }
  input.addEventListener("change", () => {
    const value = Number(input.value);
    if (Number.isFinite(value)) {
      threshold = value;
      loaded = startLoad(view); // the figures on screen are the old threshold's until the new ones are drawn
      if (timer) clearTimeout(timer);
      refresh().catch(() => {});
    }
  });
  const onVisible = () => {
    if (!document.hidden && !timer) refresh().catch(() => {});
  };
  document.addEventListener("visibilitychange", onVisible);
  await refresh();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    document.removeEventListener("visibilitychange", onVisible);
  };
}
