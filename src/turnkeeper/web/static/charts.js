"use strict";
// Small SVG charts and icons for the dashboard, drawn in the browser at the size of
// their box (so text stays legible on a phone). No library, no build step; colours
// come from CSS classes (fleet.css), never inline styles (the CSP forbids them).

const CHART_NS = "http://www.w3.org/2000/svg";

function chartNode(tag, attrs, text) {
  const node = document.createElementNS(CHART_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// 16x16 line icons (stroke: currentColor), so they take the text's colour.
const LINE_ICON_PATHS = {
  worker: ["M2.5 3.5h11v4h-11z", "M2.5 8.5h11v4h-11z", "M5 5.5h.01", "M5 10.5h.01"],
  busy: ["M8 2.5a5.5 5.5 0 1 0 0 11a5.5 5.5 0 1 0 0-11z", "M6.5 5.5l4 2.5l-4 2.5z"],
  idle: ["M8 2.5a5.5 5.5 0 1 0 0 11a5.5 5.5 0 1 0 0-11z", "M5.5 8h5"],
  queue: ["M3 4h10", "M3 8h10", "M3 12h6"],
  takeover: ["M3 6.5a5 5 0 0 1 9-2", "M12 1.5v3h-3", "M13 9.5a5 5 0 0 1-9 2", "M4 14.5v-3h3"],
  stream: ["M2 8h3l2-5l2 10l2-5h3"],
  stopped: ["M3.5 3.5h9v9h-9z"],
  clock: ["M8 2.5a5.5 5.5 0 1 0 0 11a5.5 5.5 0 1 0 0-11z", "M8 5v3l2 1.5"],
  wait: ["M5 2.5h6", "M5 13.5h6", "M5.5 2.5c0 3 5 3 5 5.5s-5 2.5-5 5.5", "M10.5 2.5c0 3-5 3-5 5.5s5 2.5 5 5.5"],
};

function lineIcon(name, label) {
  const node = chartNode("svg", {
    class: `icon icon-${name}`, viewBox: "0 0 16 16", width: 16, height: 16,
    fill: "none", stroke: "currentColor", "stroke-width": 1.5,
    "stroke-linecap": "round", "stroke-linejoin": "round",
  });
  if (label) {
    node.setAttribute("role", "img");
    node.setAttribute("aria-label", label);
    node.append(chartNode("title", {}, label));
  } else {
    node.setAttribute("aria-hidden", "true");
  }
  for (const d of LINE_ICON_PATHS[name]) node.append(chartNode("path", { d }));
  return node;
}

// A y-axis top at a round number at or above max, with `steps` gridlines; counts
// get whole-number steps.
function niceTop(max, steps) {
  if (max <= steps) return steps;
  const raw = max / steps;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw && Number.isInteger(s));
  return (step || Math.ceil(raw)) * steps;
}

const TICK_CHAR_PX = 6.4;  // about one character of the 11px tick font

// A bar chart into `box` (replacing what it drew before): one bar per label, the
// series stacked bottom up. `line`, when given, is drawn over the bars as a step line.
// A series with `href` makes each of its bars a link (href(index): the page of what
// the bar counts), and with `legendHref` its legend item too.
// opts: { labels, series: [{ key, name, values, href, legendHref }],
//         line: { key, name, values }, tick: (index) => label or null,
//         empty: text when every value is 0 }
function barChart(box, opts) {
  const width = Math.max(240, Math.floor(box.clientWidth || 0));
  const height = 168;
  const pad = { top: 10, right: 8, bottom: 24, left: 34 };
  const n = opts.labels.length;
  const totals = opts.labels.map((_, i) => opts.series.reduce((sum, s) => sum + s.values[i], 0));
  const lineMax = opts.line ? Math.max(0, ...opts.line.values) : 0;
  const top = niceTop(Math.max(0, ...totals, lineMax), 3);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const slot = plotW / Math.max(n, 1);
  const barW = Math.max(1, slot * (n > 30 ? 0.86 : 0.7));
  const y = (value) => pad.top + plotH - (value / top) * plotH;

  const chart = chartNode("svg", {
    class: "chart-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": box.querySelector("figcaption")?.textContent || "chart",
  });
  for (let k = 0; k <= 3; k += 1) {
    const value = (top / 3) * k;
    chart.append(chartNode("line", {
      class: k === 0 ? "axis" : "grid", x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value),
    }));
    const text = Number.isInteger(value) ? String(value) : value.toFixed(1);
    chart.append(chartNode("text", { class: "tick", x: pad.left - 5, y: y(value) + 3.5, "text-anchor": "end" }, text));
  }
  opts.labels.forEach((label, i) => {
    let base = 0;
    const x = pad.left + slot * i + (slot - barW) / 2;
    for (const s of opts.series) {
      const value = s.values[i];
      if (value > 0) {
        const rect = chartNode("rect", {
          class: `bar bar-${s.key}`, x: x.toFixed(2), width: barW.toFixed(2),
          y: y(base + value).toFixed(2), height: (y(base) - y(base + value)).toFixed(2),
        });
        const said = `${label}: ${value} ${s.name}`;
        rect.append(chartNode("title", {}, s.href ? `${said}: show these runs` : said));
        if (s.href) {
          const link = chartNode("a", {
            href: s.href(i), class: "bar-link", "data-bar": s.key, "data-index": i,
            "aria-label": `${said}: show these runs`,
          });
          link.append(rect);
          chart.append(link);
        } else {
          chart.append(rect);
        }
      }
      base += value;
    }
  });
  // Tick labels from the right, each kept inside the chart and clear of the one after it.
  let leftmost = width;
  for (let i = n - 1; i >= 0; i -= 1) {
    const tick = opts.tick ? opts.tick(i) : opts.labels[i];
    if (!tick) continue;
    const half = (tick.length * TICK_CHAR_PX) / 2;
    const x = Math.min(width - half - 1, Math.max(pad.left + half, pad.left + slot * i + slot / 2));
    if (x + half > leftmost - 6) continue;
    leftmost = x - half;
    chart.append(chartNode("text", {
      class: "tick", x: x.toFixed(2), y: height - 8, "text-anchor": "middle",
    }, tick));
  }
  if (opts.line) {
    let d = "";
    opts.line.values.forEach((value, i) => {
      const x0 = pad.left + slot * i;
      d += `${i === 0 ? "M" : "L"}${x0.toFixed(2)} ${y(value).toFixed(2)}H${(x0 + slot).toFixed(2)}`;
    });
    chart.append(chartNode("path", { class: `line line-${opts.line.key}`, d }));
  }
  const all = [...opts.series, ...(opts.line ? [opts.line] : [])];
  if (opts.empty && all.every((s) => s.values.every((v) => v === 0))) {
    chart.append(chartNode("text", {
      class: "empty", x: pad.left + plotW / 2, y: pad.top + plotH / 2, "text-anchor": "middle",
    }, opts.empty));
  }

  const legend = el("div", { class: "legend" });
  for (const s of all) {
    const total = s.values.reduce((sum, v) => sum + v, 0);
    const item = s.legendHref
      ? el("a", { class: "legend-item", "data-series": s.key, href: s.legendHref })
      : el("span", { class: "legend-item", "data-series": s.key });
    item.append(el("span", { class: `swatch swatch-${s.key}${s === opts.line ? " swatch-line" : ""}` }));
    item.append(document.createTextNode(s.legend || `${s.name} ${total}`));
    legend.append(item);
  }
  for (const old of box.querySelectorAll(".chart-svg, .legend")) old.remove();
  box.append(chart, legend);
}
