// Herald console: hash-routed pages fed by the stats snapshot (docs/protocol.md "Stats").
// The hash names the page and the selected item: #/topics/orders, #/subscriptions/workers,
// so a reload keeps the selection, a link opens it, and back/forward walk the selections.
import { api, ApiError, statsFeed } from "./api.js";
import { LineChart } from "./chart.js";
import { closeDialogs, duration, h, num, toast } from "./dom.js";
import { overviewPage } from "./overview.js";
import { topicsPage } from "./topics.js";
import { subscriptionsPage } from "./subscriptions.js";
import { clusterIndicator, clusterPage } from "./cluster.js";

const PAGES = { overview: overviewPage, topics: topicsPage, subscriptions: subscriptionsPage, cluster: clusterPage };

// Rates are differences of the counters between two snapshots, per second.
export const store = { snapshot: null, previous: null, rates: { published: 0, delivered: 0, subs: {} } };

function computeRates(previous, current) {
  if (!previous) return;
  const seconds = Math.max(0.001, (current.server.now_ms - previous.server.now_ms) / 1000);
  const rate = (a, b) => Math.max(0, (a - b) / seconds);
  store.rates.published = rate(current.totals.published_records_total, previous.totals.published_records_total);
  store.rates.delivered = rate(current.totals.delivered_total, previous.totals.delivered_total);
  const before = Object.fromEntries(previous.subscriptions.map((s) => [s.name, s.stats]));
  store.rates.subs = {};
  for (const sub of current.subscriptions) {
    const old = before[sub.name];
    if (!old) continue;
    store.rates.subs[sub.name] = {
      delivered: rate(sub.stats.delivered_total, old.delivered_total),
      acked: rate(sub.stats.acked_total, old.acked_total),
      redelivered: rate(sub.stats.redelivered_total, old.redelivered_total),
      // first deliveries: sends that were not retries
      first: rate(sub.stats.delivered_total - sub.stats.redelivered_total,
        old.delivered_total - old.redelivered_total),
      dead_lettered: rate(sub.stats.dead_lettered_total, old.dead_lettered_total),
    };
  }
}

// Charts live for the whole session, so coming back to Overview shows the history.
export const charts = {
  published: null,
  delivered: null,
};
const history = { published: [], delivered: [] };
const HISTORY_POINTS = 900;  // 15 minutes at one point a second, as the server keeps

export function attachChart(name, canvas, color) {
  charts[name]?.destroy();
  const chart = new LineChart(canvas, { color, capacity: HISTORY_POINTS });
  chart.points = history[name];
  charts[name] = chart;
  chart.draw();
  return chart;
}

let current = null;
let currentPage = null;

// "#/subscriptions/workers" → { page: "subscriptions", item: "workers" }.
export function parseHash(hash = location.hash) {
  const [page, ...rest] = hash.replace(/^#\/?/, "").split("/");
  let item = rest.join("/") || null;
  try { item = item && decodeURIComponent(item); } catch { item = null; }
  return { page: PAGES[page] ? page : "overview", item };
}

export function itemHash(page, item) {
  return item == null ? `#/${page}` : `#/${page}/${encodeURIComponent(item)}`;
}

// Selecting a row moves the hash (a history entry); route() then does the selecting.
export function selectItem(page, item) {
  const hash = itemHash(page, item);
  if (location.hash !== hash) location.hash = hash;
}

function route() {
  // A dialog belongs to the page that opened it: Back or a link cancels it, so nothing
  // it held (a seek, a delete) can act on the page that comes next.
  closeDialogs();
  const { page, item } = parseHash();
  if (page !== currentPage) {
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
    const main = document.getElementById("page");
    current?.leave?.();
    main.replaceChildren();
    current = PAGES[page](main);
    currentPage = page;
  }
  current.select?.(item);
  if (store.snapshot) current.update(store.snapshot);
}

// The first snapshot asks for the server's samples of the last 15 minutes (docs/protocol.md
// "Stats"): the charts open with that picture instead of empty.
function seedHistory(samples) {
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const seconds = Math.max(0.001, (b.now_ms - a.now_ms) / 1000);
    history.published.push(Math.max(0, (b.published_records_total - a.published_records_total) / seconds));
    history.delivered.push(Math.max(0, (b.delivered_total - a.delivered_total) / seconds));
  }
  for (const name of ["published", "delivered"]) {
    history[name].splice(0, Math.max(0, history[name].length - HISTORY_POINTS));
    charts[name]?.draw();
  }
}

function onSnapshot(snapshot) {
  if (snapshot.history && !store.snapshot) seedHistory(snapshot.history.samples || []);
  store.previous = store.snapshot;
  store.snapshot = snapshot;
  computeRates(store.previous, snapshot);
  if (store.previous) {
    for (const name of ["published", "delivered"]) {
      history[name].push(store.rates[name]);
      if (history[name].length > HISTORY_POINTS) history[name].shift();
      charts[name]?.draw();
    }
  }
  current?.update(snapshot);
  document.getElementById("server-info").textContent =
    `v${snapshot.server.version} · up ${duration(snapshot.server.uptime_ms)}`;
}

function onState(state) {
  const previous = store.state;
  store.state = state;
  const dot = document.getElementById("live-dot");
  dot.className = `dot ${state === "live" || state === "polling" ? "ok" : "bad"}`;
  const text = {
    live: "live",
    polling: "live (polling)",
    forbidden: "this token may not read stats (needs metrics or admin)",
    unauthorized: "token refused",
    error: "the server answered with an error",
  };
  document.getElementById("live-text").textContent = text[state] || "server unreachable";
  // Pages show the state too (Overview's Health): no new snapshot comes while it is down.
  if (store.snapshot && state !== previous) current?.update(store.snapshot);
}

// Admin actions: a 403 means the token lacks the admin right (PROTOCOL §6).
export async function adminAction(label, run) {
  try {
    const result = await run();
    return result;
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      toast(`${label}: not allowed — this needs a token with the admin right.`, true);
    } else {
      toast(`${label} failed: ${error.message}`, true);
    }
    return undefined;
  }
}

export { api, h, num };

window.addEventListener("hashchange", route);
route();
statsFeed(onSnapshot, onState);
clusterIndicator(document.getElementById("cluster-info"));
