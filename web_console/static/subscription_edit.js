// Creating a subscription (PUT, PROTOCOL §2) and changing one in place (PATCH as JSON
// Merge Patch, PROTOCOL §8 "Change in place"). The server is the validator: the forms
// send what was typed (novalidate) and show its problem JSON next to the fields, a
// filter's fault marked at its position (docs/protocol.md "Filter").
import { api, ApiError } from "./api.js";
import { h } from "./dom.js";

// The number fields PATCH takes, with PROTOCOL §2's ranges as hints.
const NUMBERS = [
  ["ack_deadline_ms", "Ack deadline (ms)", 100, 600000],
  ["max_in_flight", "Max in flight", 1, 100000],
  ["max_deliveries", "Max deliveries (0: never)", 0, 1000],
];

const field = (label, input, hint) => h("label.field", {}, h("span", {}, label), input,
  hint ? h("small.muted", {}, hint) : null);

// "" → null: an emptied field goes back to its default (RFC 7396 null).
const numberOf = (input) => (input.value.trim() === "" ? null : Number(input.value));
const textOf = (input) => (input.value.trim() === "" ? null : input.value);

// The problem JSON as a sentence, and the filter's text with its fault marked.
function showProblem(box, error, filterText) {
  const problem = error instanceof ApiError ? error.problem : null;
  if (error instanceof ApiError && error.status === 403) {
    box.replaceChildren("Not allowed: changing subscriptions needs a token with the admin right.");
  } else if (!problem) {
    box.replaceChildren(`Failed: ${error.message}`);
  } else {
    box.replaceChildren(h("b", {}, problem.code || `HTTP ${error.status}`), ": ", problem.detail || error.message);
  }
  box.hidden = false;
  const at = problem?.position;
  if (Number.isInteger(at) && filterText != null) {
    box.append(h("pre.caret", { id: box.id ? `${box.id}-caret` : null },
      `${filterText}\n${" ".repeat(Math.min(at, filterText.length))}^`));
  }
  return at;
}

function clearProblem(box) { box.hidden = true; box.replaceChildren(); }

// ------------------------------------------------------------------ edit (PATCH)

export function editPanel(sub, onSaved) {
  const config = sub.config;
  const inputs = {};
  const number = (name, label, min, max) => {
    inputs[name] = h("input.medium", { id: `edit-${name}`, type: "number", step: 1, min, max, value: config[name] });
    return field(label, inputs[name], `${min}..${max}`);
  };
  const backoffMin = h("input.medium", { id: "edit-backoff-min", type: "number", step: 1, value: config.retry_backoff.min_ms });
  const backoffMax = h("input.medium", { id: "edit-backoff-max", type: "number", step: 1, value: config.retry_backoff.max_ms });
  const dlq = h("input", { id: "edit-dlq", value: config.dead_letter_topic ?? "", placeholder: "none (dropped)" });
  const filter = h("textarea", { id: "edit-filter", rows: 2, spellcheck: "false", placeholder: 'none, e.g. headers.region = "eu" AND NOT key = "test"' });
  filter.value = config.filter ?? "";
  const push = config.push;
  const pushOn = h("input", { id: "edit-push", type: "checkbox", checked: Boolean(push) });
  const pushUrl = h("input", { id: "edit-push-url", type: "url", value: push?.url ?? "", placeholder: "https://…" });
  const pushSecret = h("input", { id: "edit-push-secret", type: "password", autocomplete: "off",
    placeholder: push ? "kept if left empty" : "whsec_… (required)" });
  const pushMax = h("input.narrow", { id: "edit-push-max-in-flight", type: "number", step: 1, value: push?.max_in_flight ?? 16 });
  const pushTimeout = h("input.narrow", { id: "edit-push-timeout", type: "number", step: 1, value: push?.timeout_ms ?? 10000 });
  const pushFields = h("fieldset", { id: "edit-push-fields", disabled: !push },
    h("legend", {}, h("label", {}, pushOn, " Push to a webhook")),
    h("div.row.fields", {}, field("URL", pushUrl), field("Secret", pushSecret)),
    h("div.row.fields", {}, field("Requests in flight", pushMax, "1..1000"), field("Timeout (ms)", pushTimeout, "100..60000")));
  // The legend's checkbox stays usable while the fieldset is disabled (HTML: the first
  // legend's contents are not disabled with it).
  pushOn.onchange = () => { pushFields.disabled = !pushOn.checked; };
  const error = h("div.error.problem", { id: "edit-error", hidden: true, role: "alert" });
  const result = h("p.muted", { id: "edit-result" });

  // Only what differs from the config on screen (RFC 7396: left out = unchanged).
  function patch() {
    const body = {};
    for (const [name] of NUMBERS) {
      const value = numberOf(inputs[name]);
      if (value !== config[name]) body[name] = value;
    }
    const backoff = { min_ms: numberOf(backoffMin), max_ms: numberOf(backoffMax) };
    if (backoff.min_ms !== config.retry_backoff.min_ms || backoff.max_ms !== config.retry_backoff.max_ms) {
      body.retry_backoff = backoff;
    }
    if (textOf(dlq)?.trim() !== (config.dead_letter_topic ?? undefined)) {
      body.dead_letter_topic = textOf(dlq)?.trim() ?? null;
    }
    if (textOf(filter) !== (config.filter ?? null)) body.filter = textOf(filter);
    if (!pushOn.checked) {
      if (push) body.push = null;
    } else {
      // A push object replaces the old one whole: members this form does not show keep
      // their values; previous_secrets is left out, so a rotation in progress is kept.
      const { previous_secrets: _, ...kept } = push || {};
      const next = { ...kept, url: pushUrl.value, max_in_flight: numberOf(pushMax), timeout_ms: numberOf(pushTimeout) };
      if (pushSecret.value) next.secret = pushSecret.value;
      const same = push && !next.secret && next.url === push.url &&
        next.max_in_flight === push.max_in_flight && next.timeout_ms === push.timeout_ms;
      if (!same) body.push = next;
    }
    return body;
  }

  const form = h("form", {
    id: "edit-form",
    novalidate: true,
    oninput: (event) => { event.currentTarget.dataset.touched = "1"; },
    onsubmit: async (event) => {
      event.preventDefault();
      clearProblem(error);
      // A number field holding what is not a number reads as "": that would be a null,
      // a reset to the default the user never asked for.
      const garbled = [...form.querySelectorAll("input[type=number]")].find((i) => i.validity.badInput);
      if (garbled) {
        showProblem(error, new Error(`${garbled.closest("label")?.firstChild?.textContent || garbled.id} is not a number`));
        return;
      }
      const body = patch();
      if (!Object.keys(body).length) { result.textContent = "Nothing changed."; return; }
      result.textContent = "Saving…";
      try {
        const saved = await api("PATCH", `/v1/subscriptions/${encodeURIComponent(sub.name)}`, body);
        onSaved(saved, Object.keys(body));
      } catch (failure) {
        result.textContent = "";
        const at = showProblem(error, failure, body.filter);
        if (Number.isInteger(at) && "filter" in body) { filter.focus(); filter.setSelectionRange(at, at + 1); }
      }
    },
  },
  h("div.row.fields", {}, ...NUMBERS.map(([name, label, min, max]) => number(name, label, min, max))),
  h("div.row.fields", {}, field("Retry backoff min (ms)", backoffMin), field("Retry backoff max (ms)", backoffMax),
    field("Dead-letter topic", dlq)),
  field("Filter (PROTOCOL §8: key and headers; empty: every record)", filter),
  pushFields,
  error,
  h("div.row", {}, h("button.primary", { type: "submit", id: "edit-save" }, "Save changes"), result));
  return h("div.panel", { id: "sub-edit" }, h("h2", {}, "Settings"),
    h("p.muted", {}, "Topic ", h("code", {}, config.topic), " · start ", h("code", {}, JSON.stringify(config.start)),
      " · ", config.delivery, config.ordered_by_key ? " · ordered by key" : "",
      ". Changes apply at once; the cursor and records in flight are kept."),
    form);
}

// ------------------------------------------------------------------ create (PUT)

export function createForm(onCreated) {
  const name = h("input", { id: "new-sub-name", placeholder: "e.g. billing", required: true });
  const topic = h("input", { id: "new-sub-topic", list: "new-sub-topics", placeholder: "e.g. orders", required: true });
  const topics = h("datalist", { id: "new-sub-topics" });
  const start = h("select", { id: "new-sub-start" }, h("option", { value: "latest" }, "latest (new records only)"),
    h("option", { value: "earliest" }, "earliest (everything kept)"));
  const dlq = h("input", { id: "new-sub-dlq", placeholder: "none" });
  const maxDeliveries = h("input.narrow", { id: "new-sub-max-deliveries", type: "number", step: 1, placeholder: "5" });
  const filter = h("input.wide", { id: "new-sub-filter", spellcheck: "false", placeholder: "none" });
  const error = h("div.error.problem", { id: "new-sub-error", hidden: true, role: "alert" });
  const form = h("form", {
    id: "new-sub-form",
    novalidate: true,
    onsubmit: async (event) => {
      event.preventDefault();
      clearProblem(error);
      if (!name.value.trim()) { showProblem(error, new Error("the subscription needs a name")); return; }
      const body = { topic: topic.value.trim(), start: start.value };
      if (textOf(dlq)) body.dead_letter_topic = dlq.value.trim();
      if (numberOf(maxDeliveries) !== null) body.max_deliveries = numberOf(maxDeliveries);
      if (textOf(filter)) body.filter = filter.value;
      try {
        const made = await api("PUT", `/v1/subscriptions/${encodeURIComponent(name.value.trim())}`, body);
        name.value = "";
        onCreated(made);
      } catch (failure) {
        showProblem(error, failure, body.filter);
      }
    },
  },
  h("div.row.fields", {}, field("Name", name), field("Topic", topic), topics, field("Start", start),
    field("Dead-letter topic", dlq), field("Max deliveries", maxDeliveries), field("Filter", filter),
    h("button.primary", { type: "submit", id: "create-sub" }, "Create subscription")),
  error);
  form.topics = (names) => {
    const have = [...topics.children].map((o) => o.value).join("\n");
    if (have !== names.join("\n")) topics.replaceChildren(...names.map((n) => h("option", { value: n })));
  };
  return form;
}
