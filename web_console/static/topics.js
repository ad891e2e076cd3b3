import { adminAction, itemHash, selectItem, store } from "./app.js";
import { api, herald } from "./api.js";
import { publishForm } from "./publish_form.js";
import { chartCard, itemCharts } from "./series.js";
import { bytes, confirmDialog, duration, h, num, patchChildren, plural, reveal, toast } from "./dom.js";

const PAGE = 20;

export function topicsPage(main) {
  let selected = null;
  const table = h("div.panel", { id: "topics-table" });
  const detail = h("div", { id: "topic-detail" });
  const name = h("input", { id: "new-topic-name", placeholder: "e.g. orders", required: true,
    pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,248}", title: "letters, digits, '.', '_' and '-'; 249 at most" });
  const partitions = h("input.narrow", { id: "new-topic-partitions", type: "number", min: 1, max: 1024, value: 1, required: true });
  const retention = h("input.medium", { id: "new-topic-retention", type: "number", min: 1, placeholder: "server default" });
  // Visible labels: a bare "1" next to a name field says nothing to a new user.
  const field = (label, input) => h("label.field", {}, h("span", {}, label), input);
  const create = h("form.row.fields", {
    onsubmit: async (event) => {
      event.preventDefault();
      const config = { partitions: Number(partitions.value) };
      if (retention.value) config.retention_ms = Number(retention.value) * 3600_000;
      const done = await adminAction("Create topic", () =>
        api("PUT", `/v1/topics/${encodeURIComponent(name.value)}`, config));
      if (done) { toast(`Topic ${done.name} ready`); name.value = ""; selectItem("topics", done.name); }
    },
  }, field("Name", name), field("Partitions", partitions), field("Retention (hours)", retention),
  h("button.primary", { type: "submit", id: "create-topic" }, "Create topic"));
  main.append(h("h1", {}, "Topics"), h("div.panel", {}, h("h2", {}, "Create a topic"), create), table, detail);

  let rendered = null;  // the topic whose detail is on screen

  return {
    select(name) {
      if (name && name === selected && rendered === name) return;
      detail.firstChild?.stop?.();
      selected = name;
      rendered = null;
      detail.replaceChildren(name ? "" : h("p.muted", { id: "topic-hint" },
        "Select a topic to see its partitions, browse its records or tail it live."));
      for (const tr of table.querySelectorAll("tr.selectable")) tr.classList.toggle("selected", tr.dataset.topic === name);
    },
    update(s) {
      const rows = s.topics.map((t) => h("tr.selectable" + (t.name === selected ? ".selected" : ""), {
        onclick: () => selectItem("topics", t.name), dataset: { topic: t.name, key: t.name },
      },
        h("td", {}, h("a", { href: itemHash("topics", t.name) }, t.name), autoCreated(t)),
        h("td.num", {}, t.partitions.length),
        h("td.num", {}, num(t.messages_total)),
        h("td.num", {}, bytes(t.partitions.reduce((a, p) => a + p.bytes, 0))),
        h("td", {}, t.config.retention_ms == null ? "unlimited" : duration(t.config.retention_ms)),
        h("td", {}, t.config.retention_bytes == null ? "unlimited" : bytes(t.config.retention_bytes)),
      ));
      patchChildren(table, [h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "Topic"), h("th.num", {}, "Partitions"),
          h("th.num", {}, "Published"), h("th.num", {}, "Bytes"), h("th", {}, "Retention"),
          h("th", {}, "Retention bytes/partition"))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td.muted.wrap", { colspan: 6, id: "topics-empty" },
          "No topics yet. Create one above, or publish to a new name: it is created on first publish ",
          "unless the server runs with --no-auto-create."))))]);
      const topic = s.topics.find((t) => t.name === selected);
      if (selected && !topic) {
        detail.firstChild?.stop?.();
        rendered = null;
        detail.replaceChildren(h("div.panel", { id: "topic-missing" },
          h("p.muted", {}, "No topic named ", h("code", {}, selected), " on this server.")));
        return;
      }
      if (topic && rendered !== topic.name) {
        rendered = topic.name;
        detail.replaceChildren(topicDetail(topic));
        reveal(detail);
        return;
      }
      const parts = document.getElementById("partitions-body");
      if (topic && parts) patchChildren(parts, partitionRows(topic));
      const subs = document.getElementById("topic-subs");
      if (topic && subs) patchChildren(subs, subscriptionList(topic.name, s));
      if (topic) detail.firstChild?.charts?.push({ now_ms: s.server.now_ms, published_records_total: topic.messages_total });
    },
    leave() { detail.firstChild?.stop?.(); },
  };
}

function partitionRows(topic) {
  return topic.partitions.map((p) => h("tr", {}, h("td", {}, p.partition), h("td.num", {}, num(p.start_offset)),
    h("td.num", {}, num(p.end_offset)), h("td.num", {}, bytes(p.bytes))));
}

// docs/protocol.md "Auto-created topics": a publish to a typo (`ordres`) makes a topic.
function autoCreated(topic) {
  if (!topic.auto_created) return null;
  return h("span.badge.warn.auto", {
    title: "Created by a publish or a subscription naming it, not by an admin (a typo?). " +
      "Servers run with --no-auto-create refuse such names instead.",
  }, "auto-created");
}

// The subscriptions reading this topic, each a link to its page.
function subscriptionList(name, snapshot) {
  const subs = (snapshot?.subscriptions || []).filter((sub) => sub.topic === name);
  if (!subs.length) return [h("p.muted", { id: "topic-no-subs" }, "No subscription reads this topic.")];
  return [h("table", {},
    h("thead", {}, h("tr", {}, h("th", {}, "Subscription"), h("th.num", {}, "Backlog"),
      h("th.num", {}, "In flight"), h("th.num", {}, "Consumers"), h("th", {}, "Kind"))),
    h("tbody", {}, subs.map((sub) => h("tr", { dataset: { subscription: sub.name, key: sub.name } },
      h("td", {}, h("a", { href: itemHash("subscriptions", sub.name) }, sub.name)),
      h("td.num", {}, num(sub.stats.backlog)), h("td.num", {}, num(sub.stats.in_flight)),
      h("td.num", {}, num(sub.stats.consumers)), h("td", {}, sub.config.push ? "webhook" : "consumers")))))];
}

function messageView(m) {
  let value;
  if (m.value_b64 !== undefined) {
    const raw = atob(m.value_b64);
    value = [...raw].map((c) => c.charCodeAt(0).toString(16).padStart(2, "0")).join(" ");
    value = `bytes (${raw.length}): ${value}`;
  } else {
    value = JSON.stringify(m.value, null, 2);
  }
  const headers = Object.entries(m.headers || {});
  return h("div.message", { dataset: { offset: m.offset } },
    h("div.meta", {},
      h("span", {}, "partition ", h("b", {}, m.partition)),
      h("span", {}, "offset ", h("b", {}, m.offset)),
      h("span", {}, new Date(m.timestamp).toISOString()),
      h("span", {}, "key ", h("b", {}, m.key ?? "—")),
      headers.length ? h("span", {}, "headers ", h("b", {}, headers.map(([k, v]) => `${k}=${v}`).join(", "))) : null),
    h("pre.value", {}, value));
}

function topicDetail(topic) {
  const t = encodeURIComponent(topic.name);
  // Browse opens on the first partition that holds records, and the empty ones say so:
  // partition 0 of a keyed topic can be empty while the others hold thousands.
  const held = (p) => p.end_offset > p.start_offset;
  const opening = topic.partitions.find(held) || topic.partitions[0];
  const partition = h("select", { id: "browse-partition" },
    topic.partitions.map((p) => h("option", { value: p.partition, selected: p === opening },
      `partition ${p.partition}${held(p) ? "" : " (empty)"}`)));
  const mode = h("select", { id: "browse-mode" }, h("option", { value: "offset" }, "from offset"),
    h("option", { value: "timestamp" }, "from time"));
  const offset = h("input.medium", { id: "browse-offset", type: "number", min: 0, value: opening?.start_offset || 0, title: "offset" });
  const time = h("input", { id: "browse-time", type: "datetime-local", step: 1, hidden: true });
  mode.onchange = () => { offset.hidden = mode.value !== "offset"; time.hidden = mode.value === "offset"; };
  const list = h("div.messages", { id: "browse-messages" });
  const info = h("span.muted", { id: "browse-info" });
  let first = 0, next = 0;

  async function load(query) {
    try {
      const data = await api("GET", `/v1/topics/${t}/partitions/${partition.value}/messages?${query}&limit=${PAGE}`);
      list.replaceChildren(...(data.messages.length ? data.messages.map(messageView) : [h("p.muted", {}, "No records here.")]));
      first = data.messages.length ? data.messages[0].offset : data.next_offset;
      next = data.next_offset;
      info.textContent = data.messages.length ? `offsets ${first}–${next - 1}` : `at offset ${next}`;
    } catch (error) { list.replaceChildren(h("p.error", {}, error.message)); }
  }
  const go = () => (mode.value === "offset" || !time.value
    ? load(`offset=${Number(offset.value) || 0}`)
    : load(`timestamp=${new Date(time.value).getTime()}`));
  const prev = () => load(`offset=${Math.max(0, first - PAGE)}`);
  const fwd = () => load(`offset=${next}`);
  partition.onchange = () => load(`offset=0`);
  load(`offset=${opening?.start_offset || 0}`);  // a selected topic shows its first records without a click

  // Live tail: the SDK's tail (PROTOCOL §3), which reconnects and resumes where it was
  // (every record once, in order per partition); pausing stops granting credit.
  const tailList = h("div.messages", { id: "tail-messages" });
  const tailButton = h("button", { id: "tail-toggle" }, "Start tail");
  const tailState = h("span.muted", { id: "tail-state" }, "stopped");
  let view = null;
  const show = (state) => {
    tailState.textContent = state;
    tailButton.textContent = { live: "Pause", paused: "Resume", reconnecting: "Pause" }[state] || "Start tail";
  };
  const stop = () => { view?.close(); view = null; };
  tailButton.onclick = () => {
    if (!view) {
      const tail = herald.tail(topic.name, {
        from: "latest",
        credit: 100,
        onMessage: (m) => {
          tailList.prepend(messageView(m));
          while (tailList.children.length > 200) tailList.lastChild.remove();
        },
        onState: (state) => {
          if (view !== tail) return;
          if (state === "open") show(tail.paused ? "paused" : "live");
          else if (state === "reconnecting") show("reconnecting");
          else if (state === "closed" && tailState.textContent !== "topic deleted") { view = null; show("stopped"); }
        },
        onError: (error) => {
          if (error.code === 4410) { view = null; show("topic deleted"); }
        },
      });
      view = tail;
    } else if (!view.paused) {
      view.pause(); show("paused");
    } else {
      view.resume(); show("live");
    }
  };

  // PROTOCOL §2: DELETE deletes the topic's subscriptions too: the question names them.
  const remove = async () => {
    const latest = store.snapshot?.topics.find((x) => x.name === topic.name) || topic;
    const held = latest.partitions.reduce((n, p) => n + p.end_offset - p.start_offset, 0);
    const subs = (store.snapshot?.subscriptions || []).filter((s) => s.topic === topic.name).map((s) => s.name);
    const ok = await confirmDialog(`Delete topic ${topic.name}?`,
      (held === 1 ? "Its one record is deleted for good" : `Its ${plural(held, "record")} are deleted for good`) +
      (subs.length ? `, and its ${plural(subs.length, "subscription")} with it: ${subs.join(", ")}.` : ".") +
      " This cannot be undone.", "Delete");
    if (!ok) return;
    stop();  // its tail would be closed with 4410 anyway
    const done = await adminAction("Delete topic", () => api("DELETE", `/v1/topics/${t}`));
    if (done !== undefined) { toast(`Topic ${topic.name} deleted`); selectItem("topics", null); }
  };

  const published = chartCard(h, "chart-topic-published", "Publish rate (records/s)");
  const charts = itemCharts("topic", topic.name,
    [{ canvas: published.canvas, color: "--accent", member: "published_records_total", rate: true }]);

  const root = h("div.split", {},
    h("div", {},
      h("div.panel", {}, h("div.row.spread", {}, h("h2", {}, `Partitions of ${topic.name}`), autoCreated(topic),
        h("button.danger", { id: "delete-topic", onclick: remove }, "Delete topic…")), h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "Partition"), h("th.num", {}, "Start offset"),
          h("th.num", {}, "End offset"), h("th.num", {}, "Bytes"))),
        h("tbody", { id: "partitions-body" }, partitionRows(topic)))),
      h("div.panel", {}, h("h2", {}, "Subscriptions"),
        h("div", { id: "topic-subs" }, subscriptionList(topic.name, store.snapshot))),
      publishForm(topic.name),
      h("div.panel", {}, h("h2", {}, "Browse messages"),
        h("div.row", {}, partition, mode, offset, time, h("button.primary", { id: "browse-load", onclick: go }, "Load")),
        h("div.row", {}, h("button", { id: "browse-prev", onclick: prev }, "← Back"),
          h("button", { id: "browse-next", onclick: fwd }, "Forward →"), info),
        list)),
    h("div", {}, published.box, h("div.panel", {}, h("h2", {}, "Live tail"),
      h("div.row", {}, tailButton, h("button", { onclick: stop }, "Stop"), tailState), tailList)));
  root.charts = charts;
  root.stop = () => { stop(); charts.destroy(); };
  return root;
}
