// One rollout: its attempts, the span tree as a timeline, each LLM call as a chat, and the transitions built
// from it with the credit and advantage LightningRL gives them (POST /v1/ui/explain).

import { badge, clear, fmtDuration, fmtNum, fmtTime, get, h, post, pretty, routeTo, startLoad } from "./lib.js";

const KIND = "agentlightning.span.kind";

function kindOf(span) {
  return span.attributes[KIND] || "other";
}

function isError(span) {
  return span.status.code === "error" || span.events.some((e) => e.name === "exception");
}

// parent/child tree of one attempt's spans; orphans (missing parent) hang at the top level
function tree(spans) {
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  const children = new Map();
  for (const s of spans) {
    const parent = s.parent_id && byId.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  for (const list of children.values()) list.sort((a, b) => a.start_time - b.start_time || a.sequence_id - b.sequence_id);
  const out = [];
  const seen = new Set();
  const walk = (parent, depth) => {
    for (const s of children.get(parent) || []) {
      if (seen.has(s.span_id)) continue;
      seen.add(s.span_id);
      out.push({ span: s, depth });
      walk(s.span_id, depth + 1);
    }
  };
  walk(null, 0);
  return out;
}

function spanDetail(span) {
  const attrs = Object.entries(span.attributes).filter(([k]) => !k.endsWith("token_ids") && !k.endsWith("logprobs"));
  const events = span.events.map((e) => {
    const a = e.attributes || {};
    if (e.name === "exception") {
      return h("div", { class: "exception" },
        h("div", { class: "error" }, h("strong", {}, a["exception.type"] || "exception"), ": ", a["exception.message"] || ""),
        a["exception.stacktrace"] ? h("pre", { class: "traceback" }, a["exception.stacktrace"]) : null);
    }
    return h("div", {}, h("strong", {}, e.name), " ", h("span", { class: "muted" }, fmtTime(e.timestamp)),
      h("pre", {}, pretty(a)));
  });
  return h("div", { class: "card", id: "span-detail", dataset: { spanId: span.span_id } },
    h("h2", {}, span.name, " ", badge(kindOf(span), "kind")),
    h("dl", { class: "kv" },
      h("dt", {}, "span id"), h("dd", { class: "mono" }, span.span_id),
      h("dt", {}, "status"), h("dd", {}, badge(span.status.code, span.status.code), " ", span.status.description || ""),
      h("dt", {}, "duration"), h("dd", {}, fmtDuration(span.end_time - span.start_time)),
      attrs.map(([k, v]) => [h("dt", { class: "mono" }, k), h("dd", { class: "mono" }, pretty(v))])),
    events.length ? h("h2", {}, "Events") : null, events);
}

function timeline(spans, detailBox) {
  const rows = tree(spans);
  if (!rows.length) return h("p", { class: "muted", id: "span-tree" }, "no spans were stored for this attempt");
  const t0 = Math.min(...spans.map((s) => s.start_time));
  const t1 = Math.max(...spans.map((s) => s.end_time));
  const total = Math.max(1e-6, t1 - t0);
  const box = h("div", { id: "span-tree", class: "card" });
  for (const { span, depth } of rows) {
    const kind = kindOf(span);
    const err = isError(span);
    const left = ((span.start_time - t0) / total) * 100;
    const width = Math.max(0.3, ((span.end_time - span.start_time) / total) * 100);
    const label = kind === "reward" ? `reward ${fmtNum(span.attributes["agentlightning.reward.value"])}`
      : kind === "judge" ? judgeLabel(span) : span.name;
    const el = h("div", { class: "span-row" + (err ? " error" : ""), dataset: { spanId: span.span_id, kind }, tabindex: 0 },
      h("div", { class: "name", style: `padding-left:${depth * 14}px`, title: span.name },
        err ? "⚠ " : "", label, h("span", { class: "kind" }, kind)),
      h("div", { class: "track" }, h("div", { class: `bar ${err ? "error" : kind}`, style: `left:${left}%;width:${width}%` })),
      h("div", { class: "num muted" }, fmtDuration(span.end_time - span.start_time)));
    el.addEventListener("click", () => {
      for (const r of box.querySelectorAll(".span-row.selected")) r.classList.remove("selected");
      el.classList.add("selected");
      clear(detailBox).append(spanDetail(span));
    });
    box.append(el);
  }
  return box;
}

// the judge's verdicts (spans of kind "judge", agentlightning.judge): one on the rollout, one per judged step
const J = "agentlightning.judge.";

function judgeLabel(span) {
  const a = span.attributes;
  if (a[J + "error"]) return `judge: no reward · ${a[J + "error"]}`;
  const what = a[J + "scope"] === "step" ? `judge step ${a[J + "step"]}` : "judge";
  return `${what} ${fmtNum(a[J + "score"])} · ${a[J + "reason"] || ""}`;
}

function judgeVerdicts(spans) {
  const judged = spans.filter((s) => kindOf(s) === "judge");
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  const steps = new Map(); // response id or call id of the judged call -> verdict span
  for (const v of judged.filter((s) => s.attributes[J + "scope"] === "step")) {
    const llm = v.parent_id && byId.get(v.parent_id);
    const key = llm ? llm.attributes["gen_ai.response.id"] : v.attributes[J + "step_id"];
    if (key) steps.set(key, v);
  }
  return { rollout: judged.filter((s) => s.attributes[J + "scope"] === "rollout"), steps };
}

function judgeCard(verdicts) {
  if (!verdicts.rollout.length && !verdicts.steps.size) return null;
  const lines = verdicts.rollout.map((v) => h("p", { class: v.attributes[J + "error"] ? "error" : null }, judgeLabel(v)));
  if (verdicts.steps.size) lines.push(h("p", { class: "muted" }, `${verdicts.steps.size} step(s) judged: see each LLM call`));
  return h("div", { class: "card", id: "judge-verdict" }, h("h2", {}, "Judge"), lines);
}

function text(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : p.text ?? pretty(p))).join("\n");
  return pretty(content);
}

function bubble(msg, extra) {
  const role = msg.role || "assistant";
  const calls = (msg.tool_calls || []).map((c) => h("div", { class: "mono" },
    "→ ", (c.function && c.function.name) || c.type || "tool", "(", (c.function && c.function.arguments) || "", ")"));
  return h("div", { class: `msg ${role} ${extra || ""}` },
    h("div", { class: "role" }, role, msg.name ? ` · ${msg.name}` : "", msg.tool_call_id ? ` · ${msg.tool_call_id}` : "",
      extra === "response" ? " · response" : ""),
    h("pre", {}, text(msg.content)), calls);
}

function chat(calls, verdicts, judged) {
  if (!calls.length) return h("p", { class: "muted", id: "chat" }, "no LLM calls went through the proxy in this attempt");
  const box = h("div", { id: "chat" });
  calls.forEach((call, i) => {
    const verdict = verdicts.get(call.call_id);
    const step = judged && (judged.steps.get(call.response_id) || judged.steps.get(call.call_id));
    const usage = (call.response && call.response.usage) || {};
    const choice = call.response && call.response.choices && call.response.choices[0];
    const answer = choice && (choice.message || { role: "assistant", content: choice.text });
    const meta = [
      `call ${i + 1}`,
      verdict && verdict.agent_name ? `agent ${verdict.agent_name}` : call.agent_name ? `agent ${call.agent_name}` : null,
      call.policy ? `policy ${call.policy}` : null,
      `prompt ${call.prompt_token_ids.length || usage.prompt_tokens || 0} tokens`,
      `response ${call.response_token_ids.length || usage.completion_tokens || 0} tokens`,
      `backend ${call.backend || "—"}`,
      `model ${call.model || call.request.model || "—"}`,
      `model version ${call.model_version ?? "—"}`,
      call.end_time ? fmtDuration(call.end_time - call.start_time) : null,
    ].filter(Boolean).join(" · ");
    const messages = call.request.messages || (call.request.prompt ? [{ role: "user", content: call.request.prompt }] : []);
    box.append(h("div", { class: "call card", dataset: { callId: call.call_id } },
      h("div", { class: "meta" }, meta, verdict ? [" · ", badge(verdict.trained ? "trained" : "not trained", verdict.trained ? "trained" : "filtered")] : null),
      messages.map((m) => bubble(m)),
      answer ? bubble(answer, "response") : null,
      step ? h("p", { class: "judge-step", dataset: { step: step.attributes[J + "step"] } }, judgeLabel(step)) : null,
      call.error ? h("p", { class: "error" }, "backend error: " + call.error) : null));
  });
  return box;
}

function transitionsTable(result) {
  const rows = result.transitions.map((t) => h("tr", { dataset: { step: t.step_index } },
    h("td", { class: "num" }, t.step_index), h("td", {}, t.agent_name || "—"),
    h("td", {}, badge(t.in_batch ? "trained" : "not trained", t.in_batch ? "trained" : "filtered")),
    h("td", { class: "num" }, t.prompt_tokens), h("td", { class: "num" }, `${t.trained_tokens}/${t.response_tokens}`),
    h("td", { class: "num" }, fmtNum(t.intermediate_reward)), h("td", { class: "num" }, fmtNum(t.final_reward)),
    h("td", { class: "num" }, fmtNum(t.credit)), h("td", { class: "num" }, fmtNum(t.advantage, 4)),
    h("td", { class: "num" }, t.model_version ?? "—"), h("td", { class: "note" }, t.note || "")));
  const verdicts = result.calls.filter((c) => !c.trained).map((c) => h("li", {},
    h("span", { class: "mono" }, c.span_id), " ", badge("filtered out", "filtered"), " ", c.reason || ""));
  return h("div", {},
    result.batch_note ? h("p", { class: "note", id: "batch-note" }, result.batch_note) : null,
    h("p", { class: "muted" }, `final reward ${fmtNum(result.final_reward)} · group ${result.group_id || "(own group)"} · `
      + `${result.group_rollouts} rollout(s) of the group in the batch`),
    h("table", { id: "transitions-table" },
      h("thead", {}, h("tr", {}, ["step", "agent", "trained", "prompt tok", "trained/resp tok", "step reward", "final reward", "credit", "advantage", "version", "note"]
        .map((t, i) => h("th", { class: [0, 3, 4, 5, 6, 7, 8, 9].includes(i) ? "num" : null }, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 11, class: "muted" }, "no transitions: no LLM call of this attempt was trained")))),
    verdicts.length ? [h("h2", {}, "LLM calls not trained"), h("ul", { id: "untrained-calls" }, verdicts)] : null,
    result.problems.length ? [h("h2", {}, "Problems"), h("ul", { id: "problems" }, result.problems.map((p) => h("li", {}, p)))] : null);
}

function explainControls(settings, options, onChange) {
  const select = (name, values) => h("select", { name, id: "explain-" + name },
    values.map((v) => h("option", { value: v, selected: settings[name] === v }, v)));
  const form = h("form", { class: "controls", id: "explain-form" },
    h("div", {}, h("label", {}, "credit"), select("credit", options.credit_strategies)),
    h("div", {}, h("label", {}, "advantage"), select("estimator", options.estimators)),
    h("div", {}, h("label", {}, "transitions"), select("mode", ["per_call", "trajectory"])),
    h("div", {}, h("label", {}, "agent filter (regex)"),
      h("input", { type: "text", name: "agent_filter", value: settings.agent_filter || "", size: 14 })),
    h("div", {}, h("label", {}, h("input", { type: "checkbox", name: "drop_equal_groups", checked: settings.drop_equal_groups }), " drop equal groups")),
    h("button", { type: "submit", class: "plain" }, "Recompute"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    onChange({
      credit: data.get("credit"), estimator: data.get("estimator"), mode: data.get("mode"),
      agent_filter: data.get("agent_filter") || null, drop_equal_groups: data.get("drop_equal_groups") === "on",
    });
  });
  return form;
}

export async function renderRollout(view, path, params, isStale, loaded) {
  const rolloutId = path[0];
  if (!rolloutId) return routeTo(["rollouts"], null);
  const [rollout, attemptsResp] = await Promise.all([
    get("/v1/rollouts/" + encodeURIComponent(rolloutId)),
    post("/v1/attempts/query", { rollout_id: rolloutId }),
  ]);
  if (isStale()) return;
  const attempts = attemptsResp.attempts;
  const chosen = attempts.find((a) => a.attempt_id === params.get("attempt")) || attempts[attempts.length - 1];
  view.append(
    h("p", {}, h("a", { href: "#/rollouts" }, "← Rollouts")),
    h("h1", { id: "rollout-title" }, h("span", { class: "mono" }, rollout.rollout_id), " ", badge(rollout.status)),
    h("dl", { class: "kv card" },
      h("dt", {}, "mode"), h("dd", {}, rollout.mode || "—"),
      h("dt", {}, "group"), h("dd", { class: "mono" }, rollout.group_id || "—"),
      h("dt", {}, "resources"), h("dd", { class: "mono" }, rollout.resources_id || "latest"),
      h("dt", {}, "created"), h("dd", {}, fmtTime(rollout.created_at)),
      h("dt", {}, "input"), h("dd", {}, h("pre", { id: "rollout-input" }, pretty(rollout.input)))));
  view.append(h("h2", {}, "Attempts"), h("table", { id: "attempts-table" },
    h("thead", {}, h("tr", {}, ["#", "status", "worker", "started", "duration", "error"].map((t) => h("th", {}, t)))),
    h("tbody", {}, attempts.map((a) => {
      const end = a.end_time || Date.now() / 1000;
      const link = new URLSearchParams({ attempt: a.attempt_id });
      return h("tr", { class: "clickable" + (a === chosen ? " selected" : ""), dataset: { attemptId: a.attempt_id },
        onclick: () => routeTo(["rollout", rolloutId], link) },
        h("td", {}, a.sequence, a === chosen ? " ◀" : ""), h("td", {}, badge(a.status)), h("td", { class: "mono" }, a.worker_id || "—"),
        h("td", {}, fmtTime(a.start_time)), h("td", {}, fmtDuration(end - a.start_time)),
        h("td", { class: "error" }, h("pre", {}, a.error || "")));
    }))));
  if (!chosen) {
    view.append(h("p", { class: "muted" }, "this rollout has not started yet"));
    loaded();
    return;
  }
  const ref = { rollout_id: rolloutId, attempt_id: chosen.attempt_id };
  const [spans, calls] = await Promise.all([post("/v1/spans/query", ref), post("/v1/llm_calls/query", ref)]);
  if (isStale()) return;
  const detail = h("div", { id: "span-detail-box" });
  const chatBox = h("div", { id: "chat-box" });
  const explainBox = h("div", { id: "transitions-box" }, h("p", { class: "muted" }, "building transitions…"));
  const judged = judgeVerdicts(spans.spans);
  const card = judgeCard(judged);
  if (card) view.append(card);
  view.append(h("h2", {}, `Timeline · attempt ${chosen.sequence}`), timeline(spans.spans, detail), detail,
    h("h2", {}, "LLM calls"), chatBox, h("h2", {}, "Transitions and credit"), explainBox);
  const firstError = spans.spans.find((s) => isError(s) && s.events.some((e) => e.name === "exception"));
  if (firstError) clear(detail).append(spanDetail(firstError));
  let settings = { credit: "identical", estimator: "grpo", mode: "per_call", agent_filter: null, drop_equal_groups: false };
  async function explain() {
    let result = null;
    try {
      result = await post("/v1/ui/explain", { ...ref, ...settings });
    } catch (err) {
      clear(explainBox).append(h("p", { class: "error", id: "explain-error" }, err.message));
      return;
    }
    if (isStale()) return;
    const verdicts = new Map();
    for (const t of result.transitions) for (const id of t.call_ids) verdicts.set(id, { agent_name: t.agent_name, trained: t.in_batch });
    clear(chatBox).append(chat(calls.calls, verdicts, judged));
    clear(explainBox).append(explainControls(settings, result, (next) => { settings = next; loaded = startLoad(view); explain(); }), transitionsTable(result));
    explainBox.dataset.credit = settings.credit;
    loaded();
  }
  clear(chatBox).append(chat(calls.calls, new Map(), judged));
  await explain();
}
