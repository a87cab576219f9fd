// Charts drawn as inline SVG by hand: a line chart (series of points) and a bar chart (counts per bucket).

const NS = "http://www.w3.org/2000/svg";
export const COLORS = ["#4f46e5", "#0ea5e9", "#16a34a", "#f59e0b", "#db2777", "#64748b"];

function s(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) if (child !== null && child !== undefined) el.append(child);
  return el;
}

function ticks(min, max, count) {
  if (max <= min) return [min];
  const raw = (max - min) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => m >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(Number(v.toFixed(10)));
  return out;
}

function label(v) {
  return Math.abs(v) >= 1000 ? v.toFixed(0) : String(Number(v.toPrecision(3)));
}

// series: [{name, color, points: [{x, y, title}]}]; options: {xLabel, yLabel, yMin, yMax, width, height}
export function lineChart(series, options = {}) {
  const W = options.width || 560, H = options.height || 240;
  const m = { l: 48, r: 12, t: 10, b: 34 };
  const pts = series.flatMap((se) => se.points);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": options.title || "chart" });
  if (!pts.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no finished attempts yet"));
    return svg;
  }
  const xs = pts.map((p) => p.x), ys = pts.map((p) => p.y);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let y0 = options.yMin ?? Math.min(...ys), y1 = options.yMax ?? Math.max(...ys);
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const X = (x) => m.l + ((x - x0) / (x1 - x0)) * (W - m.l - m.r);
  const Y = (y) => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
  const axis = s("g", { class: "axis" });
  for (const t of ticks(y0, y1, 5)) {
    axis.append(s("line", { class: "gridline", x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t) }));
    axis.append(s("text", { x: m.l - 6, y: Y(t) + 4, "text-anchor": "end" }, label(t)));
  }
  const xt = ticks(x0, x1, Math.min(8, Math.max(1, x1 - x0))).filter((t) => !options.integerX || Number.isInteger(t));
  for (const t of xt) axis.append(s("text", { x: X(t), y: H - m.b + 14, "text-anchor": "middle" }, label(t)));
  axis.append(s("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  axis.append(s("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
  if (options.xLabel) axis.append(s("text", { x: (W + m.l) / 2, y: H - 4, "text-anchor": "middle" }, options.xLabel));
  svg.append(axis);
  series.forEach((se, i) => {
    const color = se.color || COLORS[i % COLORS.length];
    const sorted = [...se.points].sort((a, b) => a.x - b.x);
    if (sorted.length > 1) {
      const d = sorted.map((p, j) => `${j ? "L" : "M"}${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`).join("");
      svg.append(s("path", { d, fill: "none", stroke: color, "stroke-width": 2, class: "series" }));
    }
    for (const p of sorted) {
      svg.append(s("circle", { cx: X(p.x), cy: Y(p.y), r: 3, fill: color, class: "point" },
        s("title", {}, p.title || `${se.name}: ${label(p.y)} at ${p.x}`)));
    }
  });
  return svg;
}

// buckets: [{x (label), values: [n1, n2]}], names/colors for the stacked values
export function barChart(buckets, names, options = {}) {
  const W = options.width || 560, H = options.height || 180;
  const m = { l: 40, r: 10, t: 10, b: 24 };
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": options.title || "bar chart" });
  const max = Math.max(1, ...buckets.map((b) => b.values.reduce((a, v) => a + v, 0)));
  const bw = (W - m.l - m.r) / Math.max(1, buckets.length);
  const Y = (y) => H - m.b - (y / max) * (H - m.t - m.b);
  for (const t of ticks(0, max, 4)) {
    svg.append(s("line", { class: "gridline", x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t) }));
    svg.append(s("text", { x: m.l - 5, y: Y(t) + 4, "text-anchor": "end" }, label(t)));
  }
  buckets.forEach((b, i) => {
    let base = 0;
    b.values.forEach((v, k) => {
      if (!v) return;
      svg.append(s("rect", {
        x: m.l + i * bw + 1, y: Y(base + v), width: Math.max(1, bw - 2), height: Y(base) - Y(base + v),
        fill: (options.colors || COLORS)[k], class: "bar",
      }, s("title", {}, `${names[k]}: ${v} (${b.x})`)));
      base += v;
    });
  });
  if (buckets.length) {
    svg.append(s("text", { x: m.l, y: H - 6 }, buckets[0].x));
    svg.append(s("text", { x: W - m.r, y: H - 6, "text-anchor": "end" }, buckets[buckets.length - 1].x));
  }
  svg.append(s("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#9ca3af" }));
  return svg;
}
