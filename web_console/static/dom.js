// h("tag.class", {attr}, ...children): builds elements; text is never parsed as HTML.
export function h(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function bytes(n) {
  if (n == null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function duration(ms) {
  if (ms == null) return "—";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export const num = (n) => (n == null ? "—" : Number(n).toLocaleString("en-US"));

// A detail drawn below a long table is off-screen: bring its top into view.
export function reveal(el) {
  if (el.getBoundingClientRect().top > window.innerHeight - 120) el.scrollIntoView({ block: "start" });
}

export function toast(text, bad = false) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = bad ? "bad" : "";
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, 5000);
}

export function confirmDialog(title, text, okLabel = "Confirm") {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Cancels an open confirmation (its promise resolves false).
export function closeDialogs() {
  const dialog = document.getElementById("confirm-dialog");
  if (dialog.open) dialog.close("cancel");
}

export const plural = (n, one, many = `${one}s`) => `${num(n)} ${n === 1 ? one : many}`;

// The page refreshes every second. Rebuilding a table then would lose a click (a click is
// a mousedown and a mouseup on the same element: a row replaced in between gets neither),
// a text selection and the hover. So fresh content is patched into what is on screen:
// nodes are kept where they match (same tag, same data-key), and only text and
// attributes that differ are written. Listeners stay those of the kept nodes, so a
// keyed row must act the same for the same key.
export function patchChildren(parent, fresh) {
  const next = fresh.flat().filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c))));
  next.forEach((node, i) => {
    const old = parent.childNodes[i];
    if (!old) parent.append(node);
    else if (sameKind(old, node)) patchNode(old, node);
    else old.replaceWith(node);
  });
  while (parent.childNodes.length > next.length) parent.lastChild.remove();
}

function sameKind(a, b) {
  if (a.nodeType !== b.nodeType || a.nodeName !== b.nodeName) return false;
  return a.nodeType !== Node.ELEMENT_NODE || a.getAttribute("data-key") === b.getAttribute("data-key");
}

function patchNode(old, fresh) {
  if (old.nodeType === Node.TEXT_NODE) {
    if (old.data !== fresh.data) old.data = fresh.data;
    return;
  }
  if (old.nodeType !== Node.ELEMENT_NODE) { old.replaceWith(fresh); return; }
  for (const { name, value } of [...fresh.attributes]) {
    if (old.getAttribute(name) !== value) old.setAttribute(name, value);
  }
  for (const { name } of [...old.attributes]) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  patchChildren(old, [...fresh.childNodes]);
}
