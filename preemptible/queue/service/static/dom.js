// Building the page from data: every text goes in as text (job names, reasons and logs come
// from users), never as HTML.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

export function table(node, headers, rows) {
  // rows: arrays of cells (text or nodes), or {attrs, cells}.
  const head = el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h }))));
  const body = el(
    "tbody",
    {},
    rows.map((row) => {
      const { attrs = {}, cells } = Array.isArray(row) ? { cells: row } : row;
      return el("tr", attrs, cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
    }),
  );
  replace(node, head, body);
}

export function show(id, visible) {
  document.getElementById(id).hidden = !visible;
}

// --- numbers as people read them ---------------------------------------------------------------

export function duration(seconds) {
  // As the CLI prints them: 42s, 7.5m, 3.2h, 2.1d.
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${(seconds / 60).toFixed(1)}m`;
  if (seconds < 3 * 86400) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

export function seconds(value) {
  // Precise short durations (graces, exits): 4 s, 2.1 s, 0.35 s.
  if (value === null || value === undefined) return "-";
  const digits = value < 1 ? 2 : value < 10 ? 1 : 0;
  return `${Number(value.toFixed(digits))} s`;
}

export function percent(ratio) {
  return `${(100 * ratio).toFixed(1)}%`;
}

export function number(value, digits = 1) {
  return Number(value.toFixed(digits)).toString();
}

export function clock(at) {
  if (at === null || at === undefined) return "-";
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

export function ordinal(n) {
  const suffix = n % 100 >= 11 && n % 100 <= 13 ? "th" : ["th", "st", "nd", "rd"][n % 10] || "th";
  return `${n}${suffix}`;
}

// A job's GPUs: "8", or for an elastic job its size now and its range: "4 (2–8)".
export function gpuSize(job) {
  const low = job.min_gpus;
  if (low === null || low === undefined || low >= job.gpus) return String(job.gpus);
  const now = job.gpu_ids.length;
  return now ? `${now} (${low}–${job.gpus})` : `${low}–${job.gpus}`;
}
