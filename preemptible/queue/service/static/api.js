// The token and the calls to /v1. The token lives in this tab's sessionStorage and travels
// only as an Authorization header to this page's own server (never in a URL or a cookie).

const KEY = "preemptible.token";

export class Refused extends Error {
  // The server answered 4xx: `status` and its message ({"error": {"code", "message"}}).
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function remember(value) {
  sessionStorage.setItem(KEY, value);
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

export async function get(path, value = token()) {
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${value}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
  });
  if (response.ok) return response.json();
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error.message;
  } catch (_) {
    // not our error shape: keep the status line
  }
  throw new Refused(response.status, message);
}
