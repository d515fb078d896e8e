// The overview: the four signals with their trend, the GPUs, the queues and the jobs.

import { gpuTiles, queueColor, sparkline } from "./charts.js";
import { duration, el, gpuSize, number, ordinal, percent, replace, table } from "./dom.js";

// The four signals of docs/maintainers/design.md §5, as [label, field, format].
const SIGNALS = [
  ["p95 wait", "p95_wait_s", duration],
  ["utilisation", "utilization", percent],
  ["goodput", "goodput", percent],
  ["preemptions / h", "preemptions_per_hour", (v) => number(v, 2)],
  ["lost GPU-s / preemption", "lost_gpu_s_per_preemption", (v) => number(v, 1)],
  ["max wait", "max_wait_s", duration],
];

function trend(history, now, pick, current) {
  // The samples of the last day plus the value now, as [t, value] points.
  const points = [];
  for (const sample of history) {
    const value = pick(sample.stats);
    if (value !== undefined && value !== null) points.push([sample.at, value]);
  }
  points.push([now, current]);
  return points;
}

function signalCard(label, value, points) {
  return el(
    "div",
    { class: "signal" },
    el("span", { class: "label", text: label }),
    el("span", { class: "value", text: value }),
    sparkline(points, { label: `${label}, last day` }),
  );
}

export function renderSignals(data, history) {
  const cards = SIGNALS.map(([label, field, format]) =>
    signalCard(label, format(data.overall[field]), trend(history, data.at, (s) => s.overall[field], data.overall[field])),
  );
  cards.push(
    signalCard(
      "max wait, least-served queue",
      duration(data.max_wait_least_served_s),
      trend(history, data.at, (s) => s.max_wait_least_served_s, data.max_wait_least_served_s),
    ),
  );
  replace(document.getElementById("signals"), cards);
  document.getElementById("window").textContent = `over the last ${duration(data.window_s)}; trends: the last day`;
}

export function renderCluster(data) {
  const names = data.queues.map((q) => q.queue.name);
  replace(document.getElementById("cluster"), gpuTiles(data.gpus, names));
  const legend = names.map((name) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.setProperty("--queue", queueColor(names, name));
    return el("span", { class: "key" }, swatch, name);
  });
  const free = data.gpus.filter((g) => g.queue === null).length;
  replace(document.getElementById("legend"), legend, el("span", { class: "key" }, el("span", { class: "swatch free" }), `free (${free})`));
}

function quota(value) {
  return value === null ? "no limit" : number(value, 1);
}

function spark(history, data, name, field, current) {
  return sparkline(trend(history, data.at, (s) => (s.queues[name] || {})[field], current), { width: 56, height: 20, label: `${field}, last day` });
}

function withSpark(text, chart) {
  return el("td", { class: "with-spark" }, el("span", { text }), chart);
}

export function renderQueues(data, history) {
  const headers = [
    "queue", "weight", "nominal / may borrow", "used", "borrowed", "lent", "fair share",
    "pending", "running", "preempting", "p95 wait", "utilisation / goodput", "preemptions / h", "lost GPU-s each", "max wait",
  ];
  const rows = data.queues.map((row) => {
    const q = row.queue;
    const s = row.signals;
    const name = el("td", { class: "queue-name" }, el("span", { class: "swatch" }), q.name);
    name.firstChild.style.setProperty("--queue", queueColor(data.queues.map((r) => r.queue.name), q.name));
    return {
      attrs: { "data-queue": q.name },
      cells: [
        name,
        number(q.weight, 2),
        `${quota(q.nominal_gpus)} / ${quota(q.borrowing_limit_gpus)}`,
        number(q.used_gpus, 1),
        number(q.borrowed_gpus, 1),
        number(row.lent_gpus, 1),
        el("td", { class: "nowrap", text: `${number(q.fair_share, 2)} (${ordinal(row.fair_share_rank)})` }),
        el("td", { class: "pending", text: String(q.pending) }),
        String(q.running - row.preempting),
        String(row.preempting),
        withSpark(duration(s.p95_wait_s), spark(history, data, q.name, "p95_wait_s", s.p95_wait_s)),
        withSpark(`${percent(s.utilization)} / ${percent(s.goodput)}`, spark(history, data, q.name, "goodput", s.goodput)),
        withSpark(number(s.preemptions_per_hour, 2), spark(history, data, q.name, "preemptions_per_hour", s.preemptions_per_hour)),
        withSpark(number(s.lost_gpu_s_per_preemption, 1), spark(history, data, q.name, "lost_gpu_s_per_preemption", s.lost_gpu_s_per_preemption)),
        withSpark(duration(s.max_wait_s), spark(history, data, q.name, "max_wait_s", s.max_wait_s)),
      ],
    };
  });
  table(document.getElementById("queues"), headers, rows);
}

export function filters() {
  return {
    queue: document.getElementById("filter-queue").value,
    state: document.getElementById("filter-state").value,
    tier: document.getElementById("filter-tier").value,
  };
}

export function fillQueueFilter(data) {
  const select = document.getElementById("filter-queue");
  const visible = data.viewer.kind === "admin" ? data.queues.map((q) => q.queue.name) : [data.viewer.name];
  const have = [...select.options].map((o) => o.value).filter((v) => v);
  if (have.join() === visible.join()) return;
  const chosen = select.value;
  replace(select, el("option", { value: "", text: "all" }), visible.map((n) => el("option", { value: n, text: n })));
  select.value = visible.includes(chosen) ? chosen : "";
}

function waited(job, now) {
  // As `queue status`: until now while pending, else until the (last) start.
  const end = job.state === "pending" ? now : job.started_at || job.finished_at || now;
  return Math.max(0, end - job.submitted_at);
}

export function renderJobs(data) {
  const shown = data.jobs;
  const rows = shown.map((job) => ({
    attrs: { "data-job": job.id, "data-state": job.state },
    cells: [
      el("a", { href: `#/jobs/${job.id}`, text: job.id }),
      job.name,
      job.queue,
      job.tier,
      el("td", { class: "state" }, el("span", { class: `badge ${job.state}`, text: job.state })),
      gpuSize(job),
      duration(waited(job, data.at)),
      el("td", { class: "reason", text: job.reason }),
    ],
  }));
  table(document.getElementById("jobs"), ["id", "name", "queue", "tier", "state", "GPUs", "waited", "reason"], rows);
  if (shown.length === 0) {
    document.querySelector("#jobs tbody").append(el("tr", {}, el("td", { colspan: 8, class: "empty", text: "no jobs" })));
  }
  const notes = [];
  if (data.jobs_matching > shown.length) {
    notes.push(`Showing ${shown.length} of ${data.jobs_matching} jobs: filter to see others.`);
  }
  if (data.viewer.kind === "queue") {
    const others = data.queues.filter((r) => r.queue.name !== data.viewer.name);
    if (others.length) {
      const counts = others.map((r) => `${r.queue.name}: ${r.queue.pending} pending, ${r.queue.running} running`);
      notes.push(`Other queues (counts only): ${counts.join("; ")}.`);
    }
  }
  document.getElementById("others").textContent = notes.join(" ");
}
