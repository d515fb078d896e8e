// A job's page: its terms and what it cost, attempts, notices, checkpoints, audit log, output.

import { clock, duration, el, gpuSize, number, replace, seconds, table } from "./dom.js";

function fact(label, value, id) {
  return el("div", { class: "fact" }, el("span", { class: "label", text: label }), el("span", { class: "value", id, text: value }));
}

function section(title, ...content) {
  return el("section", { class: "part" }, el("h2", { text: title }), ...content);
}

function grid(headers, rows, id) {
  const node = el("table", { class: "grid", id });
  table(node, headers, rows);
  return el("div", { class: "scroll" }, node);
}

function graceBar(notice) {
  // The time the job took against the grace it was given.
  const bar = el("span", { class: "bar", title: "time taken / grace given" });
  const fill = el("span", { class: notice.killed ? "fill killed" : "fill" });
  const ratio = notice.took_s === null ? 0 : Math.min(1, notice.took_s / Math.max(notice.grace_s, 1e-9));
  fill.style.setProperty("--ratio", String(ratio));
  bar.append(fill);
  return bar;
}

function who(by) {
  // The token that asked for the event; "-" for the manager's own decisions.
  if (!by) return "-";
  return by.kind === "admin" ? "admin" : `${by.kind}:${by.name}`;
}

function outcome(notice) {
  if (notice.took_s === null) return "leaving…";
  if (notice.killed) return "killed at the deadline";
  if (notice.acked) return "saved, acked, exited";
  return "exited";
}

export function renderJob(detail) {
  const job = detail.job;
  const last = job.cost.last_checkpoint_step;
  const header = el(
    "div",
    { class: "job-head" },
    el("h1", {}, `${job.id} `, el("small", { text: job.name })),
    el("span", { class: `badge ${job.state}`, id: "job-state", text: job.state }),
    el("p", { class: "why", id: "job-why", text: job.reason }),
  );
  const facts = el(
    "div",
    { class: "facts" },
    fact("queue / tier", `${job.queue} · ${job.tier}`),
    fact("GPUs", job.gpu_ids.length ? `${gpuSize(job)}: ${job.gpu_ids.join(", ")}` : gpuSize(job)),
    fact("resizes", String(job.resizes ?? 0)),
    fact("attempts", String(job.attempts), "job-attempts"),
    fact("negotiated grace", seconds(job.grace_s), "job-grace"),
    fact("minimum runtime", seconds(job.min_runtime_s)),
    fact("reported save p95", seconds(job.cost.save_seconds_p95)),
    fact("observed exit", seconds(job.cost.observed_exit_seconds)),
    fact("lost work", `${number(detail.lost_gpu_s, 1)} GPU-s`, "job-lost"),
    fact("last checkpoint", last === null ? "none reported" : `step ${last}`),
    fact("submitted", clock(job.submitted_at)),
  );

  const notices = detail.notices.map((n) => ({
    attrs: { "data-attempt": n.attempt },
    cells: [
      clock(n.at), String(n.attempt), el("td", { class: "reason", text: n.reason }),
      el("td", { class: "grace", text: seconds(n.grace_s) }),
      el("td", { class: "took", text: seconds(n.took_s) }),
      el("td", {}, graceBar(n)),
      outcome(n),
      n.lost_gpu_s === null ? "-" : number(n.lost_gpu_s, 1),
    ],
  }));
  const attempts = detail.attempts.map((a) => [
    String(a.number), clock(a.started_at), clock(a.ended_at),
    duration((a.ended_at || detail.at) - a.started_at), a.gpu_ids.join(", ") || "-", a.outcome,
  ]);
  const terms = detail.negotiations.map((t) => [
    clock(t.at), seconds(t.grace_s), seconds(t.min_runtime_s), seconds(t.save_s), seconds(t.observed_exit_s),
    t.interval_hint_s === null ? "-" : duration(t.interval_hint_s),
  ]);
  const checkpoints = detail.checkpoints.map((c) => [clock(c.at), c.step === null ? "-" : String(c.step), c.after_notice ? "ack of the notice" : ""]);
  const timeline = detail.timeline.map((e) => ({
    attrs: { "data-kind": e.kind },
    cells: [clock(e.at), el("span", { class: `kind ${e.kind}`, text: e.kind }), who(e.by), el("td", { class: "reason", text: e.reason })],
  }));
  const log = el("pre", { class: "log", id: "job-log", text: detail.log.text || "(no output yet)" });

  replace(
    document.getElementById("job-body"),
    header,
    facts,
    section("Notices: grace given, time taken", notices.length
      ? grid(["sent", "attempt", "reason", "grace", "took", "", "outcome", "lost GPU-s"], notices, "job-notices")
      : el("p", { class: "note", text: "Never told to go." })),
    section("Attempts", grid(["#", "started", "ended", "ran", "GPUs", "outcome"], attempts, "job-attempt-list")),
    section("Negotiated terms", terms.length
      ? grid(["at", "grace", "min runtime", "save p95", "observed exit", "interval hint"], terms)
      : el("p", { class: "note", text: "No cost reported yet: the default grace applies." })),
    section(`Checkpoints (${detail.checkpoints_total})`, checkpoints.length
      ? grid(["at", "step", ""], checkpoints)
      : el("p", { class: "note", text: "None reported to the manager." })),
    section("Timeline", grid(["at", "event", "by", "reason"], timeline, "job-timeline")),
    section(detail.log.truncated ? "Output (the end)" : "Output", log),
  );
  log.scrollTop = log.scrollHeight; // the newest lines in view
}
