// A small line chart on a canvas: a fixed window of points, redrawn on push.
export class LineChart {
  constructor(canvas, { capacity = 120, color = "--accent" } = {}) {
    this.canvas = canvas;
    this.capacity = capacity;
    this.color = color;
    this.points = [];
    this.resize = () => this.draw();
    window.addEventListener("resize", this.resize);
    this.scheme = matchMedia("(prefers-color-scheme: dark)");
    this.scheme.addEventListener("change", this.resize);  // colours come from the CSS
  }

  push(value) {
    this.points.push(value);
    if (this.points.length > this.capacity) this.points.shift();
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (!width || !height) return;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const style = getComputedStyle(document.documentElement);
    const line = style.getPropertyValue(this.color).trim();
    const grid = style.getPropertyValue("--line").trim();
    const muted = style.getPropertyValue("--muted").trim();
    ctx.clearRect(0, 0, width, height);
    const max = niceMax(Math.max(1, ...this.points));
    const left = 44, bottom = 18, top = 8;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = muted;
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + ((height - top - bottom) * i) / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width, y); ctx.stroke();
      ctx.fillText(compact(max * (1 - i / 4)), 4, y + 4);
    }
    ctx.fillText(this.capacity >= 120 ? `${Math.round(this.capacity / 60)} min ago` : `${this.capacity}s ago`, left, height - 4);
    ctx.fillText("now", width - 24, height - 4);
    // What is drawn, for a reader that cannot see the canvas (tests, assistive tools).
    canvas.dataset.points = this.points.length;
    canvas.dataset.peak = Math.max(0, ...this.points);
    canvas.dataset.last = this.points.length ? this.points[this.points.length - 1] : "";
    if (this.points.length < 2) return;
    const step = (width - left) / (this.capacity - 1);
    const x0 = width - step * (this.points.length - 1);
    const y = (v) => top + (height - top - bottom) * (1 - v / max);
    ctx.beginPath();
    this.points.forEach((v, i) => (i ? ctx.lineTo(x0 + i * step, y(v)) : ctx.moveTo(x0, y(v))));
    ctx.strokeStyle = line;
    ctx.lineWidth = 2;
    ctx.stroke();
    ctx.lineTo(width, height - bottom);
    ctx.lineTo(x0, height - bottom);
    ctx.closePath();
    ctx.globalAlpha = 0.12;
    ctx.fillStyle = line;
    ctx.fill();
    ctx.globalAlpha = 1;
  }

  destroy() {
    window.removeEventListener("resize", this.resize);
    this.scheme.removeEventListener("change", this.resize);
  }
}

function niceMax(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

export function compact(n) {
  if (n >= 1e9) return `${+(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
  return `${+n.toFixed(n < 10 ? 2 : 1)}`;
}
