import { attachChart, store } from "./app.js";
import { compact } from "./chart.js";
import { bytes, duration, h, num, patchChildren } from "./dom.js";

const HEALTH = { undefined: "Connecting…", live: "OK", polling: "OK", forbidden: "OK (no stats right)",
  unauthorized: "Token refused", error: "Error" };

export function overviewPage(main) {
  const cards = h("div.grid", { id: "overview-cards" });
  const chartBox = (name, title, color) => {
    const canvas = h("canvas.chart", { id: `chart-${name}` });
    const now = h("span.now", { id: `rate-${name}` }, "—");
    const box = h("div.card", {}, h("div.chart-head", {}, h("h2", {}, title), now), canvas);
    return { box, canvas, color };
  };
  const pub = chartBox("published", "Publish rate (records/s)", "--accent");
  const del = chartBox("delivered", "Deliver rate (records/s)", "--accent-2");
  // A first visit to an empty server: say how to put something in it.
  const start = h("div.panel", { id: "getting-started", hidden: true }, h("h2", {}, "Nothing here yet"),
    h("p", {}, "Publish a first record (the topic is created on first publish unless the server runs with --no-auto-create):"),
    h("pre", {}, [
      `herald publish orders '{"item": "book"}' --url ${location.origin}`,
      "",
      `curl ${location.origin}/v1/topics/orders/messages \\`,
      `  -H 'Content-Type: application/json' -d '{"messages": [{"value": {"item": "book"}}]}'`,
    ].join("\n")),
    h("p", {}, "or create a topic on the ", h("a", { href: "#/topics" }, "Topics"), " page."));
  main.append(h("h1", {}, "Overview"), start, cards, h("div.charts", {}, pub.box, del.box));
  attachChart("published", pub.canvas, pub.color);
  attachChart("delivered", del.canvas, del.color);

  return {
    update(s) {
      const t = s.totals;
      start.hidden = t.topics > 0;
      const card = (label, value, id, note, title, bad = false) =>
        h("div.card", { title }, h("div.label", {}, label), h(bad ? "div.value.bad" : "div.value", { id }, value),
          note ? h("div.note", {}, note) : null);
      // dead_lettered_total counts drops too on subscriptions without a dead_letter_topic.
      let kept = 0, dropped = 0;
      for (const sub of s.subscriptions) {
        if (sub.config.dead_letter_topic) kept += sub.stats.dead_lettered_total;
        else dropped += sub.stats.dead_lettered_total;
      }
      patchChildren(cards, [
        card("Health", HEALTH[store.state] || "Unreachable", "stat-health", null, null,
          ![undefined, "live", "polling", "forbidden"].includes(store.state)),
        card("Uptime", duration(s.server.uptime_ms), "stat-uptime"),
        card("Published", num(t.published_records_total), "stat-published"),
        card("Delivered", num(t.delivered_total), "stat-delivered"),
        card("Acked", num(t.acked_total), "stat-acked"),
        card("Dead-lettered", num(kept), "stat-dead",
          dropped ? h("span.dropped", { id: "stat-dropped" }, `+ ${num(dropped)} dropped`) : null,
          dropped ? "Records that reached max_deliveries. Dropped ones were on subscriptions with no "
            + "dead_letter_topic: they were discarded, not kept." : null),
        card("Backlog", num(t.backlog), "stat-backlog"),
        card("In flight", num(t.in_flight), "stat-inflight"),
        card("Consumers", num(t.consumers), "stat-consumers"),
        card("Topics", num(t.topics), "stat-topics"),
        card("Subscriptions", num(t.subscriptions), "stat-subscriptions"),
        card("Storage", bytes(t.storage_bytes), "stat-storage"),
      ]);
      document.getElementById("rate-published").textContent = `${compact(store.rates.published)}/s`;
      document.getElementById("rate-delivered").textContent = `${compact(store.rates.delivered)}/s`;
      document.title = `Herald ${s.server.version}`;
    },
  };
}
