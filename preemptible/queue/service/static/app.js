// The dashboard: sign in, then poll the API every two seconds and redraw the page shown
// (#/ the overview, #/jobs/ID a job). No framework and no build step.

import * as api from "./api.js";
import { show } from "./dom.js";
import { renderJob } from "./job.js";
import { fillQueueFilter, filters, renderCluster, renderJobs, renderQueues, renderSignals } from "./overview.js";

const POLL_MS = 2000;
const HISTORY_EVERY_MS = 60000;

let timer = null;
let generation = 0; // a newer tick (a filter changed, a link followed) supersedes older ones
let history = [];
let historyAt = 0;

function route() {
  const match = location.hash.match(/^#\/jobs\/([^/]+)$/);
  return match ? { page: "job", id: decodeURIComponent(match[1]) } : { page: "overview" };
}

function signedOut(message) {
  generation++;
  api.forget();
  clearTimeout(timer);
  show("status", false);
  show("overview", false);
  show("job", false);
  banner("banner", "");
  show("sign-in", true);
  const error = document.getElementById("sign-in-error");
  error.textContent = message || "";
  error.hidden = !message;
  document.getElementById("token").focus();
}

function banner(id, message) {
  const node = document.getElementById(id);
  node.textContent = message || "";
  node.hidden = !message;
}

async function refreshHistory() {
  // New samples only: one a minute arrives.
  if (Date.now() - historyAt < HISTORY_EVERY_MS) return;
  historyAt = Date.now();
  const since = history.length ? history[history.length - 1].at : 0;
  const fresh = await api.get(`/v1/signals/history?since=${since}`);
  const dayAgo = Date.now() / 1000 - 86400;
  history = history.concat(fresh).filter((s) => s.at >= dayAgo);
}

async function drawOverview() {
  // The server filters the jobs (and lists at most 500 of them).
  const f = filters();
  const params = new URLSearchParams({ state: f.state });
  if (f.queue) params.set("queue", f.queue);
  if (f.tier) params.set("tier", f.tier);
  const data = await api.get(`/v1/dashboard?${params}`);
  await refreshHistory();
  fillQueueFilter(data);
  renderSignals(data, history);
  renderCluster(data);
  renderQueues(data, history);
  renderJobs(data);
  document.getElementById("viewer").textContent =
    data.viewer.kind === "admin" ? "admin" : `queue ${data.viewer.name}`;
  show("job", false);
  show("overview", true);
}

async function drawJob(id) {
  try {
    renderJob(await api.get(`/v1/jobs/${encodeURIComponent(id)}/detail`));
    banner("job-banner", "");
  } catch (error) {
    if (!(error instanceof api.Refused) || error.status === 401) throw error;
    document.getElementById("job-body").replaceChildren();
    banner("job-banner", error.message);
  }
  show("overview", false);
  show("job", true);
}

async function tick() {
  clearTimeout(timer);
  const mine = ++generation;
  const where = route();
  try {
    if (where.page === "job") await drawJob(where.id);
    else await drawOverview();
    show("status", true);
    document.getElementById("live").className = "live";
    document.getElementById("live").textContent = "live";
    banner("banner", "");
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof api.Refused && error.status === 401) {
      signedOut(`The server no longer accepts this token: ${error.message}`);
      return;
    }
    show("status", true); // also when the first poll after signing in fails
    document.getElementById("live").className = "live lost";
    document.getElementById("live").textContent = "reconnecting";
    banner("banner", `Cannot reach the queue manager (${error.message}); retrying.`);
  }
  if (mine === generation) timer = setTimeout(tick, POLL_MS);
}

async function signIn(event) {
  event.preventDefault();
  const input = document.getElementById("token");
  const value = input.value.trim();
  try {
    await api.get("/v1/dashboard", value);
  } catch (error) {
    const why = error instanceof api.Refused ? error.message : `the server cannot be reached (${error.message})`;
    signedOut(`Refused: ${why}`);
    return;
  }
  input.value = "";
  api.remember(value);
  show("sign-in", false);
  history = [];
  historyAt = 0;
  tick();
}

document.getElementById("sign-in-form").addEventListener("submit", signIn);
document.getElementById("sign-out").addEventListener("click", () => signedOut(""));
document.getElementById("filters").addEventListener("change", () => tick());
window.addEventListener("hashchange", () => {
  window.scrollTo(0, 0);
  if (api.token()) tick();
});

if (api.token()) tick();
else signedOut("");
