// A subscription's dead letters grouped by why (PROTOCOL §8 "Dead letters say why"):
// the records of its dead_letter_topic, read through the public read API, grouped by
// their herald-source-last-error, each group's records newest first, and a redrive of
// one reason's records only (POST …/redrive with "reason", docs/protocol.md).
import { adminAction } from "./app.js";
import { api } from "./api.js";
import { confirmDialog, h, num, patchChildren, plural, toast } from "./dom.js";

const LAST_ERROR = "herald-source-last-error";
const SOURCE_TOPIC = "herald-source-topic";
const SCAN = 10_000;  // records read at most per look, the newest of each partition first
const PAGE = 1000;  // records per read request
const SHOWN = 20;  // records listed per reason

export function reasonLabel(reason) { return reason === "" ? "(no reason recorded)" : reason; }

// The newest records of every partition of `dlq`, at most SCAN in all (spread evenly).
async function readNewest(dlq) {
  const topic = await api("GET", `/v1/topics/${encodeURIComponent(dlq)}`);
  const share = Math.max(1, Math.floor(SCAN / topic.partitions.length));
  const records = [];
  let held = 0;
  for (const p of topic.partitions) {
    held += p.end_offset - p.start_offset;
    let offset = Math.max(p.start_offset, p.end_offset - share);
    while (offset < p.end_offset) {  // bounded: offset only grows, up to a known end
      const path = `/v1/topics/${encodeURIComponent(dlq)}/partitions/${p.partition}/messages`;
      const page = await api("GET", `${path}?offset=${offset}&limit=${Math.min(PAGE, p.end_offset - offset)}`);
      if (!page.messages.length) break;
      records.push(...page.messages.filter((m) => m.offset < p.end_offset));
      offset = page.next_offset;
    }
  }
  return { records, held };
}

export function groupByReason(records, sourceTopic) {
  const groups = new Map();
  let others = 0;
  for (const m of records) {
    if ((m.headers || {})[SOURCE_TOPIC] !== sourceTopic) { others++; continue; }
    const reason = m.headers[LAST_ERROR] ?? "";
    if (!groups.has(reason)) groups.set(reason, []);
    groups.get(reason).push(m);
  }
  const list = [...groups].map(([reason, items]) => {
    items.sort((a, b) => b.timestamp - a.timestamp || b.offset - a.offset);  // newest first
    return { reason, items, newest: items[0].timestamp };
  });
  list.sort((a, b) => b.items.length - a.items.length || b.newest - a.newest);
  return { groups: list, others };
}

function recordLine(m) {
  const hd = m.headers || {};
  const value = m.value_b64 !== undefined ? `bytes (base64 ${m.value_b64.length} chars)` : JSON.stringify(m.value);
  return h("li.dead-record", { dataset: { key: m.id } },
    h("span.muted", {}, new Date(m.timestamp).toLocaleString()), " ",
    h("code", {}, `${hd["herald-source-partition"] ?? "?"}-${hd["herald-source-offset"] ?? "?"}`),
    m.key != null ? [" key ", h("b", {}, m.key)] : null,
    ` · ${plural(Number(hd["herald-source-deliveries"] || 0), "delivery", "deliveries")}`,
    hd["herald-source-subscription"] ? [" · by ", h("code", {}, hd["herald-source-subscription"])] : null,
    " · ", h("code.value", {}, value.length > 200 ? `${value.slice(0, 200)}…` : value));
}

// The panel part; `refresh(held)` reads the dead-letter topic again when the number of
// records it holds (null: it does not exist yet) is not the one last read.
export function deadLetterGroups(sub, held) {
  const dlq = sub.config.dead_letter_topic;
  const box = h("div", { id: "dlq-groups", dataset: { dlq } }, h("p.muted", {}, "Reading the dead letters…"));
  const open = new Set();  // reasons whose record list is open: kept across refreshes
  let loading = null;
  let loadedHeld;  // undefined: nothing read yet
  const counts = new Map();  // reason -> records now: a kept button reads it when clicked

  async function redriveReason(reason) {
    const count = counts.get(reason) || 0;
    const ok = await confirmDialog(`Redrive “${reasonLabel(reason)}”?`,
      `Republish the ${plural(count, "dead letter")} of ${dlq} whose last error is “${reasonLabel(reason)}” ` +
      `to ${sub.topic}; those with other reasons stay where they are. Records already redriven are ` +
      "skipped (deduplicated).", "Redrive");
    if (!ok) return;
    const done = await adminAction("Redrive", () =>
      api("POST", `/v1/subscriptions/${encodeURIComponent(sub.name)}/redrive`, { reason }));
    if (!done) return;
    const text = `Redrive of “${reasonLabel(reason)}”: ${done.republished} republished, ` +
      `${done.duplicates} already redriven, ${done.other_reasons ?? 0} with other reasons left`;
    document.getElementById("redrive-result").textContent = text;
    toast(text);
  }

  function draw({ groups, others }, held, scanned) {
    counts.clear();
    for (const g of groups) counts.set(g.reason, g.items.length);
    if (!groups.length) {
      patchChildren(box, [h("p.muted", { id: "dlq-groups-empty" }, others
        ? `No dead letters from ${sub.topic}: the ${plural(others, "record")} held come from other topics.`
        : "No dead letters yet.")]);
      return;
    }
    patchChildren(box, [
      h("table", { id: "dlq-reasons" },
        h("thead", {}, h("tr", {}, h("th", {}, "Last error"), h("th.num", {}, "Records"), h("th", {}, "Newest"), h("th", {}))),
        h("tbody", {}, groups.map((g) => h("tr.reason-group", { dataset: { reason: g.reason, key: `r:${g.reason}` } },
          h("td.wrap", {}, h("code.reason", {}, reasonLabel(g.reason))),
          h("td.num.reason-count", {}, num(g.items.length)),
          h("td", {}, new Date(g.newest).toLocaleString()),
          h("td", {}, h("button.danger.redrive-reason", {
            onclick: () => redriveReason(g.reason), title: `Republish only these to ${sub.topic}`,
          }, "Redrive these…")))))),
      ...groups.map((g) => h("details.reason-records", {
        dataset: { reason: g.reason, key: `d:${g.reason}` }, open: open.has(g.reason),
        ontoggle: (event) => { if (event.target.open) open.add(g.reason); else open.delete(g.reason); },
      },
      h("summary", {}, `${reasonLabel(g.reason)}: ${plural(g.items.length, "record")}, newest first`),
      h("ul", {}, g.items.slice(0, SHOWN).map(recordLine)),
      g.items.length > SHOWN ? h("p.muted", {}, `and ${num(g.items.length - SHOWN)} older`) : null)),
      h("p.muted", { id: "dlq-groups-note" },
        scanned < held ? `Grouped: the newest ${num(scanned)} of ${num(held)} records. ` : "",
        others ? `${plural(others, "record")} from other topics not shown (a redrive skips them). ` : "",
        "A redrive leaves the dead-letter topic as it is."),
    ]);
  }

  async function load() {
    try {
      const { records, held } = await readNewest(dlq);
      loadedHeld = held;
      draw(groupByReason(records, sub.topic), held, records.length);
    } catch (error) {
      patchChildren(box, [h("p.muted", {}, error.status === 404
        ? "No dead letters yet: the first one creates the topic."
        : `Dead letters unavailable: ${error.message}`)]);
    }
  }

  const none = h("p.muted", { id: "dlq-groups-empty" }, "No dead letters yet: the first one creates the topic.");
  box.refresh = (now) => {
    if (loading || now === loadedHeld) return;
    if (now == null) { loadedHeld = now; patchChildren(box, [none]); return; }  // no 404 asked for
    loading = load().finally(() => { loading = null; });
  };
  box.refresh(held);
  return box;
}
