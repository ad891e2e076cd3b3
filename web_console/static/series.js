// A topic's or a subscription's charts (docs/protocol.md "Stats"): the server's samples of
// the last 15 minutes first (GET /v1/stats/history), then one sample per snapshot, so the
// page opens with a picture instead of an empty chart that fills as it watches.
import { api } from "./api.js";
import { LineChart } from "./chart.js";

const POINTS = 900;  // 15 minutes at one point a second, as the server keeps
const CACHED = 20;  // the samples of the last items viewed, so coming back redraws at once
const cache = new Map();  // "topic:orders" -> [{now_ms, ...counters}], oldest first

// specs: [{ canvas, color, member, rate }]: a rate chart draws the member's increase per
// second between samples; any other, the member's value (a backlog).
export function itemCharts(kind, name, specs) {
  const key = `${kind}:${name}`;
  let samples = cache.get(key) || [];
  cache.delete(key);
  cache.set(key, samples);
  while (cache.size > CACHED) cache.delete(cache.keys().next().value);
  const charts = specs.map((spec) => ({ ...spec, chart: new LineChart(spec.canvas, { color: spec.color, capacity: POINTS }) }));

  function draw() {
    for (const { chart, member, rate, canvas } of charts) {
      chart.points = rate ? rates(samples, member) : samples.slice(-POINTS).map((s) => s[member]);
      // What the chart covers, for a reader that cannot see it: a counter's increase over
      // the samples drawn, to compare with the stats (tests, assistive tools).
      if (rate) canvas.dataset.increase = samples.length ? samples.at(-1)[member] - samples[0][member] : 0;
      chart.draw();
    }
  }

  // Merged by time: the history and the snapshots overlap by a sample or two.
  function add(incoming) {
    const merged = [...samples, ...incoming].sort((a, b) => a.now_ms - b.now_ms);
    const kept = [];
    for (const s of merged) if (!kept.length || s.now_ms > kept.at(-1).now_ms) kept.push(s);
    samples = kept.slice(-(POINTS + 1));
    cache.set(key, samples);
    draw();
  }

  draw();
  api("GET", `/v1/stats/history?${kind}=${encodeURIComponent(name)}`)
    .then((body) => add(body.samples || []), () => {});  // an older server: live points only
  return {
    push(sample) { add([sample]); },
    destroy() { for (const { chart } of charts) chart.destroy(); },
  };
}

function rates(samples, member) {
  const points = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const seconds = Math.max(0.001, (b.now_ms - a.now_ms) / 1000);
    points.push(Math.max(0, (b[member] - a[member]) / seconds));
  }
  return points.slice(-POINTS);
}

// A chart in a card, as the overview draws them.
export function chartCard(h, id, title) {
  const canvas = h("canvas.chart", { id });
  return { canvas, box: h("div.card.chart-card", {}, h("div.chart-head", {}, h("h2", {}, title)), canvas) };
}
