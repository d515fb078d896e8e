// The pictures: a signal's trend as a sparkline, the machine's GPUs as tiles.

import { el } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b7dd8", "#d8843b", "#3ba56b", "#a04fc4", "#c4464f", "#2aa5a5", "#8a8a2a", "#6a5acd"];

export function queueColor(queues, name) {
  const i = queues.indexOf(name);
  return i < 0 ? "#888" : PALETTE[i % PALETTE.length];
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

export function sparkline(points, { width = 120, height = 28, label = "" } = {}) {
  // points: [[t, value], ...] oldest first. An empty trend draws a flat baseline.
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "spark", role: "img" });
  box.append(svg("title", {}));
  box.firstChild.textContent = label;
  if (points.length === 0) return box;
  const t0 = points[0][0];
  const t1 = points[points.length - 1][0];
  const top = Math.max(...points.map((p) => p[1]));
  const x = (t) => (t1 > t0 ? ((t - t0) / (t1 - t0)) * (width - 4) + 2 : width - 2);
  const y = (v) => height - 3 - (top > 0 ? (v / top) * (height - 6) : 0);
  const path = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  box.append(svg("path", { d: path, class: "spark-line" }));
  const last = points[points.length - 1];
  box.append(svg("circle", { cx: x(last[0]), cy: y(last[1]), r: 2, class: "spark-dot" }));
  return box;
}

export function gpuTiles(gpus, queues) {
  // One tile per GPU: its index, the queue holding it (colour) and, when visible, the job.
  return gpus.map((gpu) => {
    if (gpu.queue === null) {
      return el("div", { class: "gpu free", "data-gpu": gpu.index }, el("b", { text: `GPU ${gpu.index}` }), el("span", { text: "free" }));
    }
    const tile = el(
      "div",
      { class: `gpu held ${gpu.state || ""}`, "data-gpu": gpu.index, "data-queue": gpu.queue, title: gpu.state },
      el("b", { text: `GPU ${gpu.index}` }),
      gpu.job_id ? el("a", { href: `#/jobs/${gpu.job_id}`, text: gpu.job_id }) : el("span", { text: "(another team)" }),
      el("span", { class: "who", text: gpu.job_id ? `${gpu.queue} · ${gpu.tier}` : gpu.queue }),
      gpu.state === "preempting" ? el("span", { class: "leaving", text: "preempting" }) : null,
    );
    tile.style.setProperty("--queue", queueColor(queues, gpu.queue));
    return tile;
  });
}
