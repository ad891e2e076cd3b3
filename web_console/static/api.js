// The console's only way to the server: the public HTTP and WebSocket API
// (PROTOCOL §2, §3, §6 and docs/protocol.md "Stats").
const TOKEN_KEY = "herald.token";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code || "";
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

export function socketUrl(path) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  if (token()) url.searchParams.set("token", token());  // PROTOCOL §6: ?token= for browsers
  return url.toString();
}

// An answer means the server is up: only a failed fetch is "down".
const failure = (error) => (error instanceof ApiError ? (error.status === 401 ? "unauthorized" : "error") : "down");

// A stats feed: the WebSocket pushes one snapshot a second; polling GET /v1/stats
// takes over while the socket is down, and the socket is retried.
export function statsFeed(onSnapshot, onState) {
  let socket = null;
  let poll = null;
  let closed = false;
  const startPolling = () => {
    if (poll) return;
    poll = setInterval(async () => {
      try { onSnapshot(await api("GET", "/v1/stats")); onState("polling"); }
      catch (error) { onState(failure(error)); }
    }, 1000);
  };
  const connect = () => {
    if (closed) return;
    socket = new WebSocket(socketUrl("/v1/stats/ws"));
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "stats") {
        if (poll) { clearInterval(poll); poll = null; }
        onState("live");
        onSnapshot(message);
      }
    };
    socket.onclose = (event) => {
      if (closed) return;
      if (event.code === 4401) askToken().then(connect);
      else if (event.code === 4403) onState("forbidden");  // the token lacks the metrics right
      else { startPolling(); setTimeout(connect, 3000); }
    };
  };
  api("GET", "/v1/stats").then(onSnapshot, (error) => onState(failure(error))).finally(connect);
  return () => { closed = true; socket?.close(); if (poll) clearInterval(poll); };
}
