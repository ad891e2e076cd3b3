// The Cluster page (PROTOCOL §7): the nodes, and per partition its leader, epoch,
// replicas, in-sync replicas and how far each follower is behind.
//
// GET /v1/cluster (with its `partitions` extension, docs/protocol.md) is polled: every
// 1.5 s while this page is open, every 5 s otherwise (for the header's indicator), never
// while the tab is hidden (a background tab costs the server nothing; coming back
// refreshes at once). Tables are patched, not rebuilt, so a refresh does not flicker or
// lose a text selection.
import { itemHash } from "./app.js";
import { api, ApiError, token } from "./api.js";
import { h, num, patchChildren, plural } from "./dom.js";

const FAST_MS = 1500;
const SLOW_MS = 5000;
const MAX_ROWS = 500;  // a table of every partition of a large cluster is no use unfiltered

// One poller for the whole console: the last answer, or why there is none.
export const cluster = { data: null, error: null, updatedMs: 0 };
const listeners = new Set();
let fastWanted = 0;
let timer = null;
let inFlight = false;

async function poll() {
  clearTimeout(timer);
  timer = null;
  if (document.hidden || inFlight) return;
  inFlight = true;
  try {
    cluster.data = await api("GET", "/v1/cluster");
    cluster.error = null;
    cluster.updatedMs = Date.now();
  } catch (error) {
    cluster.error = error;
  } finally {
    inFlight = false;
  }
  for (const listener of listeners) {
    try { listener(cluster); } catch (error) { console.error(error); }  // the next poll still comes
  }
  schedule();
}

function schedule() {
  clearTimeout(timer);
  timer = null;
  if (!document.hidden && listeners.size) timer = setTimeout(poll, fastWanted ? FAST_MS : SLOW_MS);
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) { clearTimeout(timer); timer = null; } else if (listeners.size) poll();
});

// Calls `listener(cluster)` after every poll; `fast` asks for the page's refresh rate.
// Returns the function that stops it.
export function watchCluster(listener, fast = false) {
  listeners.add(listener);
  if (fast) fastWanted++;
  if (cluster.data || cluster.error) listener(cluster);
  if (!inFlight && (fast || !timer)) poll();
  return () => {
    listeners.delete(listener);
    if (fast) fastWanted--;
    schedule();
  };
}

// The node list: the live members GET /v1/cluster lists, and every node it does not list
// that a partition names as leader or replica, or that this tab saw earlier: those are
// not live (a node is listed while it holds its etcd lease, PROTOCOL §7). Sorted by id,
// so a node that dies keeps its row.
const seenUrls = new Map();  // node id -> its URL, as last listed
export function nodeList(data) {
  const rows = data.partitions || [];
  const nodes = data.nodes.map((n) => ({ ...n }));
  for (const n of nodes) if (n.url) seenUrls.set(n.id, n.url);
  const listed = new Set(nodes.map((n) => n.id));
  const missing = new Set([...seenUrls.keys()].filter((id) => !listed.has(id)));
  for (const p of rows) {
    for (const id of [p.leader, ...p.replicas]) if (id != null && !listed.has(id)) missing.add(id);
  }
  for (const id of missing) {
    nodes.push({ id, url: seenUrls.get(id) ?? null, live: false, leads: rows.filter((p) => p.leader === id).length });
  }
  return nodes.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

// The header's indicator: shown only in a cluster (a single node has no name).
export function clusterIndicator(el) {
  watchCluster(({ data, error }) => {
    if (error && !(error instanceof ApiError)) return;  // unreachable: keep what was shown
    if (!data || data.name == null || error) { el.hidden = true; return; }
    const nodes = nodeList(data);
    const live = nodes.filter((n) => n.live).length;
    el.hidden = false;
    el.textContent = `${data.name} · ${live}/${nodes.length} nodes live`;
    el.className = `badge ${live < nodes.length ? "warn" : "ok"}`;
    el.title = `Cluster ${data.name}; this console is on node ${data.node}`;
  });
}

const underReplicated = (p) => p.isr.length < p.replicas.length;
const leaderless = (p, live) => p.leader == null || !live.has(p.leader);

// A node's console: only http(s) URLs become links (the URL is what the node advertised).
function consoleLink(url) {
  try {
    const parsed = new URL(url);
    if (parsed.protocol === "http:" || parsed.protocol === "https:") {
      return h("a", { href: `${url.replace(/\/+$/, "")}/console/#/cluster` }, url);
    }
  } catch { /* not a URL: shown as text */ }
  return h("span.muted", {}, url ?? "unknown");
}

// This node's replication counters (PROTOCOL §7 metrics, per node), from its own
// /metrics: a page may only fetch from its own origin, so other nodes' counters are on
// their consoles. Read every 5 s while the Cluster page shows a cluster.
const COUNTERS = [
  ["herald_isr_shrinks_total", "ISR shrinks", "ISR shrinks this node wrote (as a leader)"],
  ["herald_isr_expands_total", "ISR expands", "ISR expansions this node wrote (as a leader)"],
  ["herald_leader_changes_total", "Leader changes", "times this node became the leader of a partition"],
  ["herald_lease_refusals_total", "Lease refusals", "writes refused because this node's etcd lease could have expired"],
];
const COUNTERS_MS = 5000;

export function parseCounters(text) {
  const wanted = new Set(COUNTERS.map(([name]) => name));
  const found = {};
  for (const line of text.split("\n")) {
    const [name, value] = line.split(" ");
    if (wanted.has(name) && value !== undefined && Number.isFinite(Number(value))) found[name] = Number(value);
  }
  return found;
}

async function fetchCounters() {
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  const response = await fetch("/metrics", { headers });
  return response.ok ? parseCounters(await response.text()) : {};
}

export function clusterPage(main) {
  const state = h("span.muted", { id: "cluster-state" }, "loading…");
  const cards = h("div.grid", { id: "cluster-cards" });
  const nodes = h("div", { id: "cluster-nodes" });
  const credentials = h("p.error", { id: "cluster-credentials", hidden: true });
  const filter = h("input.medium", { id: "cluster-filter", type: "search", placeholder: "filter topics" });
  const problems = h("input", { id: "cluster-problems", type: "checkbox" });
  const shown = h("span.muted", { id: "cluster-shown" });
  const parts = h("div", { id: "cluster-partitions" });
  const coordinators = h("div", { id: "cluster-coordinators" });
  main.append(
    h("div.row", {}, h("h1.inline", {}, "Cluster"), state),
    cards,
    h("div.panel", {}, h("h2", {}, "Nodes"), credentials, nodes),
    h("div.panel", {}, h("h2", {}, "Partitions"),
      h("div.row", {}, filter,
        h("label", { title: "partitions whose ISR is smaller than their replicas, or whose leader is not live" },
          problems, " only under-replicated or leaderless"), shown),
      parts),
    h("div.panel", {}, h("h2", {}, "Subscriptions"),
      h("p.muted", {}, "each runs on one node, its coordinator; consumers may connect to any node"),
      coordinators),
  );

  let counters = {};
  let countersAt = 0;
  const render = () => {
    const { data, error } = cluster;
    if (error) {
      const why = error instanceof ApiError
        ? (error.status === 403 ? "this token may not read the cluster (needs metrics or admin)" : error.message)
        : "server unreachable";
      state.textContent = data ? `${why}: showing what it said ${ago(cluster.updatedMs)}` : why;
      state.className = "error";
    } else if (data) {
      state.textContent = `refreshed every ${FAST_MS / 1000} s`;
      state.className = "muted";
    }
    if (!data) return;
    if (!error && data.name != null && Date.now() - countersAt >= COUNTERS_MS) {
      countersAt = Date.now();
      fetchCounters().then((found) => { counters = found; render(); }, () => {});
    }
    const rows = data.partitions || [];
    const all = nodeList(data);
    const live = new Set(all.filter((n) => n.live).map((n) => n.id));
    patchChildren(cards, summaryCards(data, all, rows, live));
    patchChildren(nodes, [nodesTable(data, all, rows, counters)]);
    const mismatch = credentialsMismatch(all);
    credentials.hidden = !mismatch;
    credentials.textContent = mismatch || "";
    const wanted = filter.value.trim().toLowerCase();
    const picked = rows
      .filter((p) => !wanted || p.topic.toLowerCase().includes(wanted))
      .filter((p) => !problems.checked || underReplicated(p) || leaderless(p, live))
      .sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
    shown.textContent = picked.length > MAX_ROWS
      ? `showing ${num(MAX_ROWS)} of ${num(picked.length)}: filter to see the rest`
      : plural(picked.length, "partition");
    patchChildren(parts, [partitionsTable(picked.slice(0, MAX_ROWS), live, rows.length)]);
    patchChildren(coordinators, [coordinatorsTable(data.subscriptions || [], live)]);
  };
  filter.addEventListener("input", render);
  problems.addEventListener("change", render);
  const stop = watchCluster(render, true);

  return {
    update() {},  // fed by its own poll, not by the stats snapshot
    leave: stop,
  };
}

function ago(ms) {
  const s = Math.round((Date.now() - ms) / 1000);
  return s < 2 ? "just now" : `${s} s ago`;
}

function summaryCards(data, all, rows, live) {
  const card = (label, value, id, kind = "") =>
    h("div.card", {}, h("div.label", {}, label), h(`div.value${kind}`, { id }, value));
  const under = rows.filter(underReplicated).length;
  const orphans = rows.filter((p) => leaderless(p, live)).length;
  return [
    card("Cluster", data.name ?? "single node", "cluster-name"),
    card("This node", data.node, "cluster-this-node"),
    card("Nodes live", `${live.size} / ${all.length}`, "cluster-live", live.size < all.length ? ".bad" : ""),
    card("Partitions", num(rows.length), "cluster-partition-count"),
    card("Under-replicated", num(under), "cluster-under-replicated", under ? ".warn" : ""),
    card("Without a live leader", num(orphans), "cluster-leaderless", orphans ? ".bad" : ""),
  ];
}

// docs/security.md: each node reads its own credentials file, so revocations and rate
// limits are per node; GET /v1/cluster shows a digest of each live node's file.
function credentialsMismatch(all) {
  const digests = new Set(all.filter((n) => n.live && n.credentials).map((n) => n.credentials));
  if (digests.size < 2) return null;
  return `The live nodes have ${digests.size} different credentials files: a token revoked on ` +
    "one node still works on the others until every node has the same file (docs/security.md).";
}

// Per node, what the partitions say of it as a follower: how many it replicates, in how
// many it is out of sync, and its largest lag; then this node's own counters.
function nodesTable(data, all, rows, counters) {
  const shownCounters = COUNTERS.filter(([name]) => counters[name] !== undefined);
  const hereDigest = all.find((n) => n.id === data.node)?.credentials;
  const body = all.map((n) => {
    const here = n.id === data.node;
    const replicated = rows.filter((p) => p.replicas.includes(n.id));
    const outOfSync = replicated.filter((p) => !p.isr.includes(n.id)).length;
    const lags = replicated.map((p) => p.lag[n.id]).filter((x) => typeof x === "number");
    return h(here ? "tr.selected" : "tr", { dataset: { node: n.id, key: n.id } },
      h("td", {}, h("b", {}, n.id), here ? h("span.badge.here", { title: "the node this console is on" }, "this node") : null),
      h("td", {}, consoleLink(n.url)),
      h("td", {}, h(`span.badge.${n.live ? "ok" : "bad"}`, { dataset: { live: String(n.live) } }, n.live ? "live" : "not live")),
      h("td.num", { dataset: { col: "leads" } }, num(n.leads)),
      h("td.num", { dataset: { col: "replicas" } }, num(replicated.length)),
      h(outOfSync ? "td.num.bad" : "td.num", { dataset: { col: "out-of-sync" } }, num(outOfSync)),
      h("td.num", { dataset: { col: "max-lag" } }, lags.length ? num(Math.max(...lags)) : "—"),
      h(n.credentials && n.credentials !== hereDigest ? "td.bad" : "td",
        { dataset: { col: "credentials" }, title: "digest of the node's credentials file" },
        n.credentials ? h("code", {}, n.credentials) : "—"),
      shownCounters.map(([name]) => h("td.num", { dataset: { col: name }, title: here ? null : "on that node's console" },
        here ? num(counters[name]) : "—")));
  });
  return h("table", { id: "nodes-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "URL (its console)"), h("th", {}, "State"),
      h("th.num", {}, "Partitions led"),
      h("th.num", { title: "partitions this node holds a copy of, led or followed" }, "Replicas"),
      h("th.num", { title: "partitions where this node is a replica but not in the ISR" }, "Out of sync"),
      h("th.num", { title: "the most records this node is behind a leader, as its leaders report" }, "Max lag"),
      h("th", { title: "digest of the node's credentials file (docs/security.md): differs from this node's in red" }, "Credentials"),
      shownCounters.map(([, label, why]) => h("th.num", { title: `${why} (this node only)` }, label)))),
    h("tbody", {}, body));
}

// Which node coordinates each subscription (PROTOCOL §7; GET /v1/cluster `subscriptions`).
function coordinatorsTable(subscriptions, live) {
  const body = subscriptions.map((s) => h("tr", { dataset: { key: s.name, subscription: s.name } },
    h("td", {}, h("a", { href: itemHash("subscriptions", s.name) }, s.name)),
    h("td", { dataset: { col: "coordinator" } }, s.coordinator == null
      ? h("span.badge.bad", { title: "no live coordinator: another node takes it over shortly" }, "none")
      : live.has(s.coordinator) ? s.coordinator
        : h("span.badge.bad", {}, `${s.coordinator} (not live)`))));
  return h("table", { id: "coordinators-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "Subscription"), h("th", {}, "Coordinator"))),
    h("tbody", {}, body.length ? body
      : h("tr", {}, h("td.muted", { colspan: 2, id: "coordinators-empty" }, "No subscriptions yet."))));
}

function partitionsTable(rows, live, total) {
  const body = rows.map((p) => {
    const inIsr = new Set(p.isr);
    const followers = p.replicas.filter((r) => r !== p.leader);
    const replica = (id) => {
      const oos = !inIsr.has(id);
      return h(`span.replica${oos ? ".oos" : ""}${id === p.leader ? ".leader" : ""}`,
        { title: oos ? `${id} is out of sync: not in the ISR` : null }, id);
    };
    const lag = followers.map((id) => {
      const oos = !inIsr.has(id);
      const n = p.lag[id];
      return h(`span.lag${oos ? ".oos" : ""}`, { dataset: { follower: id },
        title: oos ? `${id} is not in the ISR` : `${id} is in the ISR` }, `${id} ${n == null ? "—" : num(n)}`);
    });
    const noLeader = leaderless(p, live);
    return h(`tr${underReplicated(p) ? ".under" : ""}`,
      { dataset: { key: `${p.topic}/${p.partition}`, topic: p.topic, partition: p.partition } },
      h("td", {}, h("a", { href: itemHash("topics", p.topic) }, p.topic)),
      h("td.num", {}, p.partition),
      h("td", { dataset: { col: "leader" } }, noLeader
        ? h("span.badge.bad", { title: p.leader == null ? "no leader" : `${p.leader} is not live` },
          p.leader == null ? "none" : `${p.leader} (not live)`)
        : p.leader),
      h("td.num", { dataset: { col: "epoch" } }, p.epoch ?? "—"),
      h("td", { dataset: { col: "replicas" } }, p.replicas.map(replica)),
      h("td", { dataset: { col: "isr" } }, p.isr.join(", ")),
      h("td.num", { dataset: { col: "hwm" } }, num(p.high_watermark)),
      h("td.num", { dataset: { col: "log-end" } }, num(p.log_end)),
      h("td", { dataset: { col: "lag" } }, lag.length ? lag : h("span.muted", {}, "no followers")));
  });
  const empty = total === 0
    ? "No partitions yet: topics appear here once created."
    : "No partition matches.";
  return h("table", { id: "partitions-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "Topic"), h("th.num", {}, "Partition"), h("th", {}, "Leader"),
      h("th.num", {}, "Epoch"),
      h("th", { title: "out-of-sync replicas (not in the ISR) are marked" }, "Replicas"),
      h("th", { title: "in-sync replicas" }, "ISR"),
      h("th.num", { title: "what readers may see: stored by every ISR member" }, "High watermark"),
      h("th.num", { title: "the leader's next offset to write" }, "Log end"),
      h("th", { title: "records each follower is behind the leader's log end" }, "Follower lag (records)"))),
    h("tbody", {}, body.length ? body : h("tr", {}, h("td.muted", { colspan: 9, id: "partitions-empty" }, empty))));
}
