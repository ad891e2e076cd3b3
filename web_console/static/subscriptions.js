import { adminAction, itemHash, selectItem, store } from "./app.js";
import { api, ApiError } from "./api.js";
import { compact } from "./chart.js";
import { confirmDialog, duration, h, num, patchChildren, plural, reveal, toast } from "./dom.js";
import { deadLetterGroups } from "./dead_letters.js";
import { createForm, editPanel } from "./subscription_edit.js";
import { chartCard, itemCharts } from "./series.js";

const PAUSE = {
  none: ["delivering", "ok"],
  no_credit: ["paused: no consumer credit", "warn"],
  max_in_flight: ["paused: max_in_flight reached", "warn"],
  backoff: ["paused: backoff", "warn"],
  delayed: ["waiting: delayed records", "ok"],
  circuit_open: ["paused: webhook circuit open", "bad"],
};

// Without a dead_letter_topic, "dead-lettered" records are dropped (PROTOCOL §2): the same
// counter, but nothing is kept, so the console says "dropped" and why.
export function dropsInsteadOfDeadLetters(sub) { return !sub.config.dead_letter_topic; }

export function droppedWhy(sub) {
  return `No dead_letter_topic is set on ${sub.name}: records that reached max_deliveries ` +
    `(${sub.config.max_deliveries}) were dropped, not kept.`;
}

// "paused: backoff" only when nothing is deliverable: the server says "backoff" whenever
// nothing is ready to send at that instant and a record waits out its retry delay, which
// is also true between two records of a stream that is flowing. So the badge also asks
// that nothing be in flight and that no first delivery or ack happened since the
// previous snapshot (about a second).
function waitingOnBackoffOnly(sub) {
  if (sub.pause_reason !== "backoff" || sub.stats.in_flight > 0) return false;
  const r = store.rates.subs[sub.name];
  return !(r && (r.first > 0 || r.acked > 0));
}

// PROTOCOL §4 breaker, in words: "open" alone reads as "connected" to a newcomer.
const ENDPOINT_STATE = {
  closed: "sending normally",
  open: "the breaker opened after consecutive failures: nothing is sent until a probe",
  half_open: "one probe request decides whether sending resumes",
};

export function subscriptionsPage(main) {
  let selected = null;
  let rendered = null;  // the name whose detail is on screen
  let ticks = 0;
  let charts = null;  // the selected subscription's rate and backlog charts
  // The config the detail was drawn with; after a save, the one the snapshots should
  // catch up to (one taken before the PATCH may still arrive) and until when to wait.
  let drawnConfig = null;
  let awaited = null;
  let awaitedUntil = 0;
  const table = h("div.panel", { id: "subs-table" });
  const detail = h("div", { id: "sub-detail" });
  const create = createForm((made) => { toast(`Subscription ${made.name} ready`); selectItem("subscriptions", made.name); });
  main.append(h("h1", {}, "Subscriptions"), h("div.panel", {}, h("h2", {}, "Create a subscription"), create), table, detail);

  function pause(sub) {
    let [text, kind] = PAUSE[sub.pause_reason] || [`paused: ${sub.pause_reason}`, "warn"];
    let title = null;
    const unattached = sub.pause_reason === "no_credit" && sub.stats.consumers === 0 && !sub.push;
    const caughtUp = sub.pause_reason === "none" && sub.stats.backlog === 0;
    const waiting = sub.stats.backlog - sub.stats.in_flight;
    if (sub.pause_reason === "backoff") {
      if (waitingOnBackoffOnly(sub)) {
        title = `Nothing can be sent now: ${plural(waiting, "record")} ${waiting === 1 ? "waits" : "wait"} ` +
          "out a retry delay (retry_backoff or a nack's delay_ms).";
      } else {
        [text, kind] = PAUSE.none;
        title = "Records are flowing; some wait out a retry delay (retry_backoff or a nack's delay_ms).";
      }
    }
    if (unattached) title = "No consumer is attached: records wait in the log.";
    const label = unattached ? "no consumers" : caughtUp ? "caught up" : text;
    return h(`span.badge.${unattached ? "" : kind}`, { dataset: { pause: sub.pause_reason }, title }, label);
  }

  // In the table: "3 dropped"; in the detail, whose row is labelled "Dropped": "3 (0/s)".
  function deadLetters(sub, rate) {
    const inDetail = rate !== undefined;
    const n = num(sub.stats.dead_lettered_total) + (inDetail ? ` (${compact(rate)}/s)` : "");
    if (!dropsInsteadOfDeadLetters(sub)) return n;
    const kind = sub.stats.dead_lettered_total ? "span.dropped" : "span.dropped.none";
    return h(kind, { title: droppedWhy(sub) }, inDetail ? n : `${n} dropped`);
  }

  const hint = () => h("p.muted", { id: "sub-hint" },
    "Select a subscription to see its details, change its settings, seek it or redrive its dead letters.");

  function show(sub) {
    rendered = sub.name;
    render(sub);
    reveal(detail);
  }

  return {
    select(name) {
      if (name && name === selected && rendered === name) return;
      selected = name;
      rendered = null;
      charts?.destroy();
      charts = null;
      detail.replaceChildren(name ? "" : hint());
      for (const tr of table.querySelectorAll("tr.selectable")) {
        tr.classList.toggle("selected", tr.dataset.subscription === name);
      }
    },
    update(s) {
      create.topics(s.topics.map((t) => t.name));
      const rows = s.subscriptions.map((sub) => {
        const r = store.rates.subs[sub.name] || {};
        return h("tr.selectable" + (sub.name === selected ? ".selected" : ""), {
          dataset: { subscription: sub.name, key: sub.name },
          onclick: () => selectItem("subscriptions", sub.name),
        },
          h("td", {}, h("a", { href: itemHash("subscriptions", sub.name) }, sub.name)),
          h("td", {}, sub.topic),
          h("td.num", {}, num(sub.stats.backlog)), h("td.num", {}, num(sub.stats.in_flight)),
          h("td.num", {}, num(sub.stats.consumers)),
          h("td.num", {}, `${num(sub.stats.delivered_total)} · ${compact(r.delivered || 0)}/s`),
          h("td.num", {}, `${num(sub.stats.acked_total)} · ${compact(r.acked || 0)}/s`),
          h("td.num", {}, num(sub.stats.redelivered_total)),
          h("td.num", { dataset: { dead: sub.name } }, deadLetters(sub)),
          h("td.num", {}, duration(sub.oldest_unacked_age_ms)),
          h("td", {}, pause(sub)));
      });
      patchChildren(table, [h("table", {},
        h("thead", {}, h("tr", {}, ...["Subscription", "Topic"].map((x) => h("th", {}, x)),
          ...["Backlog", "In flight", "Consumers", "Delivered", "Acked", "Redelivered"].map((x) => h("th.num", {}, x)),
          h("th.num", { title: "Records that reached max_deliveries: published to the dead_letter_topic, or dropped when none is set" }, "Dead letters"),
          h("th.num", {}, "Oldest unacked"), h("th", {}, "Delivery"))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td.muted.wrap", { colspan: 11, id: "subs-empty" }, "No subscriptions yet. Create one with ",
          h("code", {}, "herald subscriptions create NAME --topic TOPIC --start earliest"), " or ",
          h("code", {}, "PUT /v1/subscriptions/NAME"), " (README, docs/protocol.md)."))))]);
      const sub = s.subscriptions.find((x) => x.name === selected);
      if (selected && !sub) {
        rendered = null;
        charts?.destroy();
        charts = null;
        detail.replaceChildren(h("div.panel", { id: "sub-missing" },
          h("p.muted", {}, "No subscription named ", h("code", {}, selected), " on this server.")));
        return;
      }
      if (sub && rendered !== sub.name) { show(sub); return; }
      if (sub && changedElsewhere(sub)) { render(sub); return; }
      const stats = document.getElementById("sub-stats");
      if (sub && stats) patchChildren(stats, statRows(sub));
      if (sub) charts?.push({ now_ms: s.server.now_ms, delivered_total: sub.stats.delivered_total,
        acked_total: sub.stats.acked_total, backlog: sub.stats.backlog });
      const consumers = document.getElementById("sub-consumers");
      if (sub && consumers) patchChildren(consumers, consumerList(sub));
      const size = document.getElementById("dlq-size");
      if (sub && size) size.textContent = dlqSize(sub.config.dead_letter_topic);
      if (sub?.config.dead_letter_topic) showRedrivable(sub.config.dead_letter_topic);
      const groups = document.getElementById("dlq-groups");
      if (sub && groups) groups.refresh(dlqHeld(groups.dataset.dlq));
      const drops = document.getElementById("dropped-count");
      if (sub && drops) drops.textContent = plural(sub.stats.dead_lettered_total, "record");
      if (sub?.config.push) {
        const pushStats = document.getElementById("push-stats");
        if (pushStats) patchChildren(pushStats, pushRows(sub));
        const box = document.getElementById("attempts");
        if (box && ++ticks % 3 === 0) loadAttempts(encodeURIComponent(sub.name), box);
      }
    },
    leave() { charts?.destroy(); charts = null; },
  };

  function statRows(sub) {
    const r = store.rates.subs[sub.name] || {};
    const row = (k, v, id) => h("tr", {}, h("th", {}, k), h("td", { id }, v));
    return [
      row("Delivery", pause(sub), "sub-pause"),
      row("Backlog", num(sub.stats.backlog), "sub-backlog"),
      row("In flight", num(sub.stats.in_flight)),
      // PROTOCOL §8 delayed delivery: read, waiting for their deliver_at (in the backlog).
      row("Delayed", num(sub.stats.delayed ?? 0), "sub-delayed"),
      row("Delivered", `${num(sub.stats.delivered_total)} (${compact(r.delivered || 0)}/s)`),
      row("Acked", `${num(sub.stats.acked_total)} (${compact(r.acked || 0)}/s)`, "sub-acked"),
      row("Redelivered", `${num(sub.stats.redelivered_total)} (${compact(r.redelivered || 0)}/s)`),
      row(dropsInsteadOfDeadLetters(sub) ? "Dropped" : "Dead-lettered",
        deadLetters(sub, r.dead_lettered || 0), "sub-dead"),
      row("Oldest unacked", duration(sub.oldest_unacked_age_ms)),
      row("Ack floors", sub.stats.partitions.map((p) => `p${p.partition}: ${p.ack_floor}`).join(", "), "sub-floors"),
    ];
  }

  // docs/protocol.md "Stats": the consumers attached now (RabbitMQ's "Consumers" table).
  function consumerList(sub) {
    if (!sub.consumers) return [h("p.muted", {}, "This server does not list its consumers.")];
    if (!sub.consumers.length) return [h("p.muted", { id: "no-consumers" }, "No consumer is connected.")];
    const now = store.snapshot?.server.now_ms || Date.now();
    return [h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Consumer"), h("th", {}, "Address"),
        h("th.num", {}, "Credit"), h("th.num", {}, "In flight"), h("th", {}, "Connected since"))),
      h("tbody", {}, sub.consumers.map((c) => h("tr", { dataset: { consumer: c.id, key: c.id } },
        h("td", {}, h("code", {}, c.id)), h("td", {}, c.address ?? "—"),
        h("td.num", {}, num(c.credit)), h("td.num", {}, num(c.in_flight)),
        h("td", {}, c.connected_ms == null ? "—"
          : `${new Date(c.connected_ms).toLocaleString()} (${duration(now - c.connected_ms)})`)))))];
  }

  function pushRows(sub) {
    const p = sub.push || {};
    const state = p.endpoint_state || "unknown";
    const kind = state === "closed" ? "ok" : state === "open" ? "bad" : "warn";
    const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", {}, v ?? "—"));
    return [
      row("Endpoint state", h("span", {}, h(`span.badge.${kind}`, {}, state), " ",
        h("span.muted", { id: "endpoint-state-why" }, ENDPOINT_STATE[state] || ""))),
      row("Last status", p.last_status), row("Last error", p.last_error),
      row("Concurrency", p.endpoint_concurrency), row("In flight", p.endpoint_in_flight),
      row("Requests / failures", p.endpoint_requests_total == null ? null
        : `${num(p.endpoint_requests_total)} / ${num(p.endpoint_failures_total)}`),
    ];
  }

  // PROTOCOL §8 push.batch and push.payload: what each request to the endpoint carries.
  function pushBody(push) {
    const batch = push.batch || { max_records: 1, max_wait_ms: 0 };
    if (batch.max_records > 1) {
      const wait = batch.max_wait_ms ? `, or after ${num(batch.max_wait_ms)} ms` : ", or what is ready";
      return `Batches: up to ${num(batch.max_records)} records per request${wait} ({"messages":[…]}).`;
    }
    return push.payload === "raw"
      ? "Raw bodies: one record's value per request, the rest in herald-* headers."
      : "One record per request, as JSON.";
  }

  function dlqHeld(dlq) {
    const topic = store.snapshot?.topics.find((t) => t.name === dlq);
    return topic ? topic.partitions.reduce((n, p) => n + p.end_offset - p.start_offset, 0) : null;
  }

  function dlqSize(dlq) {
    const held = dlqHeld(dlq);
    return held == null ? "not created yet (the first dead letter creates it)" : `${plural(held, "record")} held`;
  }

  // Nothing to redrive: the button would only earn a 404 (no topic yet) or a no-op.
  function showRedrivable(dlq) {
    const button = document.getElementById("redrive");
    if (!button) return;
    button.disabled = !dlqHeld(dlq);
    button.title = button.disabled ? `Nothing to redrive: ${dlq} holds no records.` : "";
  }

  // PROTOCOL §2 seek moves the cursor for good: every seek asks first, saying what moves.
  function seekQuestion(sub, target, label) {
    const latest = store.snapshot?.subscriptions.find((x) => x.name === sub.name) || sub;
    if (target.to === "latest") {
      const backlog = latest.stats.backlog;
      return backlog
        ? `${sub.name} moves to the end of ${sub.topic}: its backlog of ${plural(backlog, "record")} ` +
          "is skipped and will not be delivered (seek back to earliest or to a time to replay it)."
        : `${sub.name} is caught up: nothing is skipped.`;
    }
    if (target.to === "earliest") {
      const topic = store.snapshot?.topics.find((t) => t.name === sub.topic);
      const held = topic ? topic.partitions.reduce((n, p) => n + p.end_offset - p.start_offset, 0) : null;
      return `${sub.name} moves to the start of ${sub.topic}: ` +
        (held == null ? "every record it holds" : `all ${plural(held, "record")} it holds`) +
        " are delivered again, including those already acked.";
    }
    return `${sub.name} moves to the first record of ${sub.topic} published at or after ${label}: ` +
      "earlier records are skipped, later ones are delivered again, including those already acked.";
  }

  // Changed by someone else (the CLI, another tab): drawn again, unless the settings
  // form is being edited (the user's typing wins; saving sends only what differs).
  function changedElsewhere(sub) {
    const now = JSON.stringify(sub.config);
    if (awaited && (now === awaited || Date.now() > awaitedUntil)) awaited = null;
    return !awaited && now !== drawnConfig && !document.getElementById("edit-form")?.dataset.touched;
  }

  // PROTOCOL §8: PATCH answers with the GET body; the detail is drawn again from it.
  function saved(body, changed) {
    awaited = JSON.stringify(body.config);
    awaitedUntil = Date.now() + 5000;
    const latest = store.snapshot?.subscriptions.find((x) => x.name === body.name);
    show({ ...(latest || {}), ...body, stats: { ...(latest?.stats || {}), ...body.stats }, config: body.config });
    const text = `Saved: ${changed.join(", ")}.`;
    document.getElementById("edit-result").textContent = text;
    toast(`${body.name}: ${text}`);
  }

  function render(sub) {
    drawnConfig = JSON.stringify(sub.config);
    const n = encodeURIComponent(sub.name);
    const when = h("input", { id: "seek-time", type: "datetime-local", step: 1 });
    const seek = async (target, label) => {
      const ok = await confirmDialog(`Seek ${sub.name} to ${label}?`, seekQuestion(sub, target, label), "Seek");
      if (!ok) return;
      const done = await adminAction("Seek", () => api("POST", `/v1/subscriptions/${n}/seek`, target));
      if (done) toast(`${sub.name}: seeked to ${label}`);
    };
    const dlq = sub.config.dead_letter_topic;
    const redrive = async () => {
      const ok = await confirmDialog("Redrive all dead letters?",
        `Republish the records of ${dlq} to ${sub.topic}. Records already redriven are skipped (deduplicated).`,
        "Redrive");
      if (!ok) return;
      const done = await adminAction("Redrive", () => api("POST", `/v1/subscriptions/${n}/redrive`, {}));
      if (done) {
        const text = `Redrive: ${done.republished} republished, ${done.duplicates} already redriven, ${done.skipped} from other topics`;
        document.getElementById("redrive-result").textContent = text;
        toast(text);
      }
    };
    const push = sub.config.push;
    const webhook = h("div.panel", { id: "webhook" }, h("h2", {}, "Webhook"),
      push ? h("p", {}, "Endpoint ", h("code", {}, push.url || JSON.stringify(push))) : h("p.muted", {}, "Not a push subscription."),
      push ? h("p.muted", { id: "push-body" }, pushBody(push)) : null,
      push ? h("table", {}, h("tbody", { id: "push-stats" }, pushRows(sub))) : null,
      h("div", { id: "attempts" }, push ? "Loading attempt log…" : null));
    if (push) loadAttempts(n, webhook.querySelector("#attempts"));
    const delivered = chartCard(h, "chart-sub-delivered", "Deliver rate (records/s)");
    const acked = chartCard(h, "chart-sub-acked", "Ack rate (records/s)");
    const backlog = chartCard(h, "chart-sub-backlog", "Backlog (records)");
    charts?.destroy();
    charts = itemCharts("subscription", sub.name, [
      { canvas: delivered.canvas, color: "--accent-2", member: "delivered_total", rate: true },
      { canvas: acked.canvas, color: "--accent", member: "acked_total", rate: true },
      { canvas: backlog.canvas, color: "--warn", member: "backlog", rate: false },
    ]);
    detail.replaceChildren(h("div.split", {},
      h("div.panel", {}, h("h2", {}, sub.name),
        h("p.muted", {}, "On topic ", h("a", { href: itemHash("topics", sub.topic) }, sub.topic)),
        h("table", {}, h("tbody", { id: "sub-stats" }, statRows(sub))),
        h("h2", {}, "Consumers"), h("div", { id: "sub-consumers" }, consumerList(sub))),
      h("div", {},
        h("div.panel", {}, h("h2", {}, "Seek"),
          h("p.muted", {}, "Move where ", sub.name, " reads from, in every partition. Each seek asks first."),
          h("div.row", {},
            h("button", { id: "seek-earliest", onclick: () => seek({ to: "earliest" }, "earliest") }, "Earliest…"),
            h("button", { id: "seek-latest", onclick: () => seek({ to: "latest" }, "latest") }, "Latest…")),
          h("div.row.fields", {}, h("label.field", {}, h("span", {}, "Time (your local time)"), when), h("button", {
            id: "seek-timestamp",
            onclick: () => when.value && seek({ timestamp: new Date(when.value).getTime() }, when.value.replace("T", " ")),
          }, "Seek to time…"))),
        h("div.panel", {}, h("h2", {}, "Dead letters"),
          dlq ? h("div.row", {}, h("span", {}, "Topic ", h("a", { href: itemHash("topics", dlq) }, h("code", {}, dlq)), " · ",
            h("span", { id: "dlq-size" }, dlqSize(dlq))),
            h("button.danger", { id: "redrive", onclick: redrive }, "Redrive all…"))
            : h("p", { id: "no-dlq" }, h("span.dropped", {}, "Dropped, not kept: "),
              "no dead_letter_topic is set, so records that reach max_deliveries " +
              `(${sub.config.max_deliveries}${sub.config.max_deliveries ? "" : ": never"}) are dropped and counted — `,
              h("b", { id: "dropped-count" }, plural(sub.stats.dead_lettered_total, "record")),
              " so far. Set a dead_letter_topic on the subscription to keep them."),
          dlq ? deadLetterGroups(sub, dlqHeld(dlq)) : null,
          h("p.muted", { id: "redrive-result" })),
        webhook)),
      h("div.charts", {}, delivered.box, acked.box, backlog.box),
      editPanel(sub, saved));
    if (dlq) showRedrivable(dlq);
  }
}

// GET /v1/subscriptions/{name}/attempts comes with webhook push; older servers answer 404.
async function loadAttempts(n, box) {
  try {
    const data = await api("GET", `/v1/subscriptions/${n}/attempts`);
    const attempts = data.attempts || [];
    patchChildren(box, [
      h("h2", {}, "Attempt log"),
      attempts.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["Time", "Record", "Attempt", "Status", "Latency", "Error"].map((x) => h("th", {}, x)))),
        h("tbody", {}, attempts.slice(0, 50).map((a) => h("tr", {},
          h("td", {}, a.time ? new Date(a.time).toLocaleTimeString() : "—"),
          // A batch (PROTOCOL §8) is one request: its first record and how many it carried.
          h("td", {}, a.id ?? "—", a.count > 1 ? h("span.muted", {}, ` +${a.count - 1} more`) : null),
          h("td", {}, a.attempt ?? "—"), h("td", {}, a.status ?? "—"),
          h("td", {}, a.latency_ms != null ? `${Number(a.latency_ms).toFixed(1)} ms` : "—"), h("td", {}, a.error ?? ""))))) :
        h("p.muted", {}, "No attempts yet.")]);
  } catch (error) {
    box.replaceChildren(h("p.muted", {}, error instanceof ApiError && (error.status === 404 || error.status === 405)
      ? "This server has no attempt log." : `Attempt log unavailable: ${error.message}`));
  }
}
