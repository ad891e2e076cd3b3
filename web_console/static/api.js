// The console's only way to the server: the public HTTP API, and the browser SDK for
// its live views (the stats stream, topic tails)
// (PROTOCOL §2, §3, §6 and docs/protocol.md "Stats").
import { Herald } from "../sdk/herald.js";

const TOKEN_KEY = "herald.token";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code || "";
    this.problem = problem || null;  // the whole problem JSON: forms show its members inline
  }
}

export function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

let asking = null;

// PROTOCOL §6: no token → 401. Ask once, however many requests were refused.
export function askToken() {
  if (!asking) {
    asking = new Promise((resolve) => {
      const dialog = document.getElementById("token-dialog");
      const input = document.getElementById("token-input");
      // A 401 while a token is set means that token was refused: say so, or the same
      // dialog coming back looks like the paste did not take.
      document.getElementById("token-refused").hidden = !token();
      input.value = "";
      dialog.addEventListener("close", () => {
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        asking = null;
        resolve();
      }, { once: true });
      dialog.showModal();
    });
  }
  return asking;
}

export async function api(method, path, body) {
  for (let attempt = 0; ; attempt++) {
    const headers = {};
    if (token()) headers.Authorization = `Bearer ${token()}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401 && attempt < 3) { await askToken(); continue; }
    const text = await response.text();
    const data = text ? JSON.parse(text) : null;
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }
}

// The one client for live data (issue 17): the browser SDK the server serves at /sdk/.
// A 4401 or a refused token brings the token dialog back, once for every stream.
export const herald = new Herald({
  urls: [location.origin],
  maxBackoffMs: 3000,
  getToken: async ({ refused, token: old }) => {
    if (refused && (old || "") === token()) await askToken();
    return token();
  },
});

// An answer means the server is up: only a failed fetch is "down".
const failure = (error) => (error instanceof ApiError ? (error.status === 401 ? "unauthorized" : "error") : "down");

// A stats feed: the SDK's stats stream pushes one snapshot a second; polling GET
// /v1/stats takes over while that stream is down (and tells "down" from "error").
export function statsFeed(onSnapshot, onState) {
  let poll = null;
  const stopPolling = () => { if (poll) { clearInterval(poll); poll = null; } };
  const startPolling = () => {
    if (poll) return;
    poll = setInterval(async () => {
      try { onSnapshot(await api("GET", "/v1/stats")); onState("polling"); }
      catch (error) { onState(failure(error)); }
    }, 1000);
  };
  let stream = null;
  api("GET", "/v1/stats?history=1").then(onSnapshot, (error) => onState(failure(error))).finally(() => {
    stream = herald.stats({
      onSnapshot: (snapshot) => { stopPolling(); onState("live"); onSnapshot(snapshot); },
      onState: (state) => { if (state === "reconnecting") startPolling(); },
      onError: (error) => { if (error.code === 4403) { stopPolling(); onState("forbidden"); } },  // no metrics right
    });
  });
  return () => { stream?.close(); stopPolling(); };
}
