// Publishing one record from the topic page (PROTOCOL §2 "Publish"), as an operator
// tests a consumer: key, headers and a JSON value. The server is the validator: the form
// answers with the partition and offset, or with the problem's detail.
import { api, ApiError } from "./api.js";
import { h } from "./dom.js";

const field = (label, input) => h("label.field", {}, h("span", {}, label), input);

// "" → absent; anything else must parse as JSON (the server checks the shape).
function parsed(input, what) {
  const text = input.value.trim();
  if (text === "") return undefined;
  try { return JSON.parse(text); } catch (error) { throw new Error(`${what} is not JSON: ${error.message}`); }
}

export function publishForm(topic) {
  const t = encodeURIComponent(topic);
  const key = h("input", { id: "publish-key", placeholder: "none", autocomplete: "off" });
  const headers = h("textarea", { id: "publish-headers", rows: 2, placeholder: '{"source": "console"}' });
  const value = h("textarea", { id: "publish-value", rows: 4, placeholder: '{"order": 4711}', required: true });
  const result = h("p", { id: "publish-result", role: "status" });
  const say = (text, bad) => { result.replaceChildren(...text); result.className = bad ? "error" : "muted"; };
  const form = h("form", {
    id: "publish-form",
    novalidate: true,
    onsubmit: async (event) => {
      event.preventDefault();
      const message = {};
      try {
        message.value = parsed(value, "The value");
        if (message.value === undefined) throw new Error("The value is empty: write JSON, e.g. {\"n\": 1} or \"text\".");
        const heads = parsed(headers, "The headers");
        if (heads !== undefined) message.headers = heads;
      } catch (error) { say([error.message], true); return; }
      if (key.value !== "") message.key = key.value;
      try {
        const answer = await api("POST", `/v1/topics/${t}/messages`, { messages: [message] });
        const [r] = answer.results;
        say([`Published to partition ${r.partition} at offset ${r.offset}`, r.duplicate ? " (a duplicate)." : "."], false);
      } catch (error) {
        const problem = error instanceof ApiError ? error.problem : null;
        if (error instanceof ApiError && error.status === 403) {
          say(["Not allowed: publishing needs a token with the publish or admin right."], true);
        } else {
          say([h("b", {}, problem?.code || "failed"), ": ", problem?.detail || error.message], true);
        }
      }
    },
  },
  h("div.row.fields", {}, field("Key", key)),
  field("Headers (a JSON object of strings; empty: none)", headers),
  field("Value (JSON)", value),
  h("div.row", {}, h("button.primary", { type: "submit", id: "publish-send" }, "Publish")),
  result);
  return h("div.panel", { id: "publish" }, h("h2", {}, `Publish to ${topic}`), form);
}
