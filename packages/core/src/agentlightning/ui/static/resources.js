// Resources: every published version (model endpoint, prompt templates, values) and which one is current.

import { badge, fmtTime, get, h, pretty } from "./lib.js";

function describe(item) {
  if (item.kind === "llm") {
    return [h("div", {}, h("strong", {}, item.model), " at ", h("span", { class: "mono" }, item.endpoint)),
      Object.keys(item.sampling_parameters || {}).length ? h("div", { class: "muted mono" }, pretty(item.sampling_parameters)) : null];
  }
  if (item.kind === "prompt_template") return h("pre", {}, item.template);
  return h("pre", {}, pretty(item.value));
}

export async function renderResources(view, _path, _params, isStale, loaded) {
  const { resources } = await get("/v1/resources/all");
  if (isStale()) return;
  const newest = resources.length ? resources[resources.length - 1].version : null;
  const rows = [...resources].reverse().map((r) => h("tr", { dataset: { version: r.version } },
    h("td", { class: "num" }, r.version, " ", r.version === newest ? badge("current", "current") : null),
    h("td", { class: "mono" }, r.resources_id),
    h("td", {}, fmtTime(r.created_at)),
    h("td", {}, Object.entries(r.items).map(([name, item]) => h("div", {}, h("span", { class: "badge" }, name), " ", item.kind, describe(item))))));
  view.append(h("h1", {}, "Resources"),
    h("p", { class: "muted" }, "Rollouts pinned to a resources id run with that version; the others take the current one."),
    h("table", { id: "resources-table" },
      h("thead", {}, h("tr", {}, ["version", "resources id", "published", "items"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "no resources published yet")))));
  loaded();
}
