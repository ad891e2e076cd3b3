// The Cluster page (PROTOCOL §7): the nodes, and per partition its leader, epoch,
// replicas, in-sync replicas and how far each follower is behind.
//
// GET /v1/cluster is polled: every 1.5 s while this page is open, every 5 s otherwise
// (for the header's indicator), never while the tab is hidden (a background tab costs
// the server nothing; coming back refreshes at once). Tables are patched, not rebuilt,
// so a refresh does not flicker or lose a text selection.
import { itemHash } from "./app.js";
import { api, ApiError } from "./api.js";
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
  for (const listener of listeners) listener(cluster);
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

// The header's indicator: shown only in a cluster (a single node has no name).
export function clusterIndicator(el) {
  watchCluster(({ data, error }) => {
    if (error && !(error instanceof ApiError)) return;  // unreachable: keep what was shown
    if (!data || data.name == null || error) { el.hidden = true; return; }
    const live = data.nodes.filter((n) => n.live).length;
    el.hidden = false;
    el.textContent = `${data.name} · ${live}/${data.nodes.length} nodes live`;
    el.className = `badge ${live < data.nodes.length ? "warn" : "ok"}`;
    el.title = `Cluster ${data.name}; this console is on node ${data.node}`;
  });
}

// Partition rows: the cluster's own (`partitions`, with high watermark, log end and lag),
// or, from a server that does not list them (a single node), the topics of the stats
// snapshot, which are GET /v1/topics/{topic} bodies (read once a second anyway: no
// request per topic per refresh). A single node leads all its partitions, alone in their
// ISR, at epoch 0 (PROTOCOL §7: a single node is a cluster of one).
export function partitionRows(data, topics) {
  if (Array.isArray(data.partitions)) {
    return data.partitions.map((p) => ({ ...p, lag: p.lag || {} }));
  }
  if (!topics) return null;
  return topics.flatMap((t) => t.partitions.map((p) => ({
    topic: t.name,
    partition: p.partition,
    leader: p.leader !== undefined ? p.leader : data.node,
    epoch: p.epoch ?? 0,
    replicas: p.replicas ?? [data.node],
    isr: p.isr ?? [data.node],
    high_watermark: p.end_offset,  // PROTOCOL §7: end_offset is the high watermark
    log_end: p.replicas ? null : p.end_offset,  // unknown from a topic body in a cluster
    lag: {},
  })));
}

const liveIds = (data) => new Set(data.nodes.filter((n) => n.live).map((n) => n.id));
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
  return h("span", {}, url ?? "—");
}

// Per-node replication figures, when the server reports them on the node
// (`metrics`: name -> number): one column per name any node has.
function metricNames(nodes) {
  const names = new Set();
  for (const n of nodes) for (const [k, v] of Object.entries(n.metrics || {})) if (typeof v === "number") names.add(k);
  return [...names].sort();
}

export function clusterPage(main) {
  const state = h("span.muted", { id: "cluster-state" }, "loading…");
  const cards = h("div.grid", { id: "cluster-cards" });
  const nodes = h("div", { id: "cluster-nodes" });
  const filter = h("input.medium", { id: "cluster-filter", type: "search", placeholder: "filter topics" });
  const problems = h("input", { id: "cluster-problems", type: "checkbox" });
  const shown = h("span.muted", { id: "cluster-shown" });
  const parts = h("div", { id: "cluster-partitions" });
  main.append(
    h("div.row", {}, h("h1.inline", {}, "Cluster"), state),
    cards,
    h("div.panel", {}, h("h2", {}, "Nodes"), nodes),
    h("div.panel", {}, h("h2", {}, "Partitions"),
      h("div.row", {}, filter,
        h("label", { title: "partitions whose ISR is smaller than their replicas, or whose leader is not live" },
          problems, " only under-replicated or leaderless"), shown),
      parts),
  );

  let snapshotTopics = null;
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
    const rows = partitionRows(data, snapshotTopics);
    const live = liveIds(data);
    patchChildren(cards, summaryCards(data, rows, live));
    patchChildren(nodes, [nodesTable(data)]);
    if (!rows) { patchChildren(parts, [h("p.muted", {}, "loading partitions…")]); return; }
    const wanted = filter.value.trim().toLowerCase();
    const picked = rows
      .filter((p) => !wanted || p.topic.toLowerCase().includes(wanted))
      .filter((p) => !problems.checked || underReplicated(p) || leaderless(p, live))
      .sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
    shown.textContent = picked.length > MAX_ROWS
      ? `showing ${num(MAX_ROWS)} of ${num(picked.length)}: filter to see the rest`
      : plural(picked.length, "partition");
    patchChildren(parts, [partitionsTable(picked.slice(0, MAX_ROWS), live, rows.length)]);
  };
  filter.addEventListener("input", render);
  problems.addEventListener("change", render);
  const stop = watchCluster(render, true);

  return {
    update(snapshot) { snapshotTopics = snapshot.topics; render(); },
    leave: stop,
  };
}

function ago(ms) {
  const s = Math.round((Date.now() - ms) / 1000);
  return s < 2 ? "just now" : `${s} s ago`;
}

function summaryCards(data, rows, live) {
  const card = (label, value, id, kind = "") =>
    h("div.card", {}, h("div.label", {}, label), h(`div.value${kind}`, { id }, value));
  const cards = [
    card("Cluster", data.name ?? "single node", "cluster-name"),
    card("This node", data.node, "cluster-this-node"),
    card("Nodes live", `${live.size} / ${data.nodes.length}`, "cluster-live",
      live.size < data.nodes.length ? ".bad" : ""),
  ];
  if (rows) {
    const under = rows.filter(underReplicated).length;
    const orphans = rows.filter((p) => leaderless(p, live)).length;
    cards.push(
      card("Partitions", num(rows.length), "cluster-partition-count"),
      card("Under-replicated", num(under), "cluster-under-replicated", under ? ".warn" : ""),
      card("Without a live leader", num(orphans), "cluster-leaderless", orphans ? ".bad" : ""),
    );
  }
  return cards;
}

function nodesTable(data) {
  const names = metricNames(data.nodes);
  const rows = data.nodes.map((n) => {
    const here = n.id === data.node;
    return h(here ? "tr.selected" : "tr", { dataset: { node: n.id, key: n.id } },
      h("td", {}, h("b", {}, n.id), here ? h("span.badge.here", { title: "the node this console is on" }, "this node") : null),
      h("td", {}, consoleLink(n.url)),
      h("td", {}, h(`span.badge.${n.live ? "ok" : "bad"}`, { dataset: { live: String(n.live) } }, n.live ? "live" : "not live")),
      h("td.num", { dataset: { leads: n.id } }, num(n.leads)),
      names.map((k) => h("td.num", {}, num(n.metrics?.[k]))));
  });
  return h("table", { id: "nodes-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "URL (its console)"), h("th", {}, "State"),
      h("th.num", {}, "Partitions led"), names.map((k) => h("th.num", {}, k.replaceAll("_", " "))))),
    h("tbody", {}, rows));
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
