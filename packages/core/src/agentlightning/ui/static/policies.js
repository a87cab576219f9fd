// Runs, per policy: one reward curve per policy over its model versions (a run with `PolicyMap` serves each agent by
// its policy's adapter, whose versions count that adapter's updates), and the rows behind them. A run without
// policies gets one curve per agent instead.

import { COLORS, lineChart } from "./chart.js";
import { fmtNum, h } from "./lib.js";

// The rows of one curve: training rows if there are any (held-out evaluations would mix in), else all.
function curveRows(policies) {
  const train = policies.filter((p) => p.mode === "train");
  return train.length ? train : policies;
}

// [{name, points}] with the reward mean per model version, attempts weighting each (policy, agent) row
export function policySeries(policies) {
  const byPolicy = policies.some((p) => p.policy !== null);
  const keyOf = (p) => (byPolicy ? p.policy ?? "(no policy)" : p.agent_name ?? "(unknown agent)");
  const groups = new Map();
  for (const p of curveRows(policies)) {
    if (p.model_version === null || p.reward_mean === null) continue;
    const key = keyOf(p);
    if (!groups.has(key)) groups.set(key, { agents: new Set(), versions: new Map() });
    const group = groups.get(key);
    if (p.agent_name !== null) group.agents.add(p.agent_name);
    const acc = group.versions.get(p.model_version) || { sum: 0, n: 0 };
    acc.sum += p.reward_mean * p.rewarded;
    acc.n += p.rewarded;
    group.versions.set(p.model_version, acc);
  }
  const series = [...groups.entries()].map(([key, group]) => ({
    name: byPolicy && group.agents.size ? `${key} (${[...group.agents].join(", ")})` : key,
    key,
    points: [...group.versions.entries()].map(([version, acc]) => ({
      x: version, y: acc.sum / acc.n, title: `${key} · version ${version}: ${fmtNum(acc.sum / acc.n)} (${acc.n} rewarded)`,
    })),
  }));
  return { byPolicy, series };
}

function legend(names) {
  return h("div", { class: "legend" }, names.map((n, i) => h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }), n)));
}

// {chart, table}: the runs page puts the chart beside the others and the table under the per-version one
export function policyPanel(stats) {
  const policies = stats.policies || [];
  const { byPolicy, series } = policySeries(policies);
  const what = byPolicy ? "policy" : "agent";
  const chart = h("div", { class: "card chart", id: "chart-policy-reward", "data-by": what },
    h("h2", {}, `Reward mean per ${what} and model version`),
    series.length
      ? [lineChart(series, { xLabel: "model version", integerX: true, title: `reward mean per ${what}` }),
        legend(series.map((se) => se.name))]
      : h("p", { class: "muted" }, "no LLM calls of finished attempts yet"));
  series.forEach((se, i) => chart.setAttribute(`data-series-${i}`, se.key));
  const rows = policies.map((p) => h("tr", { "data-policy": p.policy ?? "" },
    h("td", {}, p.policy ?? "—"), h("td", {}, p.agent_name ?? "—"), h("td", { class: "num" }, p.model_version ?? "—"),
    h("td", {}, p.mode || "—"), h("td", { class: "num" }, p.calls), h("td", { class: "num" }, p.attempts),
    h("td", { class: "num" }, fmtNum(p.reward_mean))));
  const table = h("table", { id: "policies-table" },
    h("thead", {}, h("tr", {}, ["policy", "agent", "version", "mode", "calls", "attempts", "reward mean"]
      .map((t, i) => h("th", { class: i === 2 || i >= 4 ? "num" : null }, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no LLM calls yet"))));
  return { chart, table: [h("h2", {}, "Per policy and agent"), table] };
}
