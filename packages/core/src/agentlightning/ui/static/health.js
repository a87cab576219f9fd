// Health: agl doctor's checks over the newest finished rollouts of the run, refreshed while the page is visible, so
// a problem that appears mid-run (rewards stop arriving, answers cut by max_tokens, calls that bypass the proxy) is
// seen. One line per finding with its fix, then the counts per agent and call site (POST /v1/ui/health).

import { badge, h, post } from "./lib.js";

const REFRESH_MS = 10000;

const ratio = (part, whole) => (whole ? `${part}/${whole}` : "—");

function siteRow(s) {
  return h("tr", {},
    h("td", {}, s.where), h("td", { class: "num" }, ratio(s.recorded, s.calls)),
    h("td", { class: "num" }, ratio(s.with_token_ids, s.recorded)), h("td", { class: "num" }, ratio(s.prefix_extends, s.multi_turn)),
    h("td", { class: "num" }, ratio(s.tool_calls_parsed, s.tool_calls_attempted)), h("td", { class: "num" }, s.truncated),
    h("td", { class: "num" }, ratio(s.trained, s.calls)));
}

export function drawHealth(body, report) {
  const f = report.figures;
  const rewards = f.reward_min === null ? "none" : `${f.reward_min}..${f.reward_max}`;
  const findings = report.findings.map((x) => h("li", { dataset: { check: x.check } },
    badge(x.severity, x.severity === "problem" ? "failed" : "timeout"), " ", h("strong", {}, x.check), " ",
    x.site ? h("span", { class: "mono" }, x.site + ": ") : null, x.message));
  body.replaceChildren(
    h("p", { id: "health-verdict" }, badge(report.trainable ? "trainable" : "not trainable", report.trainable ? "ok" : "error"),
      ` over the newest ${report.checked} finished rollouts: reward on ${f.with_reward} (${rewards}), groups without reward ` +
      `variance ${f.flat_groups}/${f.groups}, ${f.transitions} transitions, ${f.calls_per_rollout} calls and ` +
      `${f.seconds_per_rollout} s per rollout`),
    findings.length ? h("ul", { id: "health-findings" }, findings) : h("p", { class: "muted" }, "no finding"),
    h("table", { id: "health-sites" },
      h("thead", {}, h("tr", {}, ["agent / call site", "recorded", "token ids", "prefix", "tools parsed", "cut", "trained"]
        .map((t, i) => h("th", { class: i ? "num" : null }, t)))),
      h("tbody", {}, report.sites.length ? report.sites.map(siteRow)
        : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no LLM call yet")))));
}

export async function renderHealth(view, _path, _params, isStale, loaded) {
  const body = h("div", { id: "health-body" });
  view.append(h("h1", {}, "Health"),
    h("p", { class: "muted" }, "agl doctor's checks of the run as it goes (the chat template check needs the model: agl doctor --store … --model …)."),
    body);
  let timer = null;
  let stopped = false;
  async function refresh() {
    timer = null;
    if (stopped || isStale()) return;
    const report = await post("/v1/ui/health", { last: 64 });
    if (stopped || isStale()) return;
    drawHealth(body, report);
    loaded();
    if (!document.hidden) timer = setTimeout(() => refresh().catch(() => {}), REFRESH_MS);
  }
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
