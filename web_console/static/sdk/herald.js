// Herald browser SDK: a dependency-free ES module (docs/browser.md).
//
//   import { Herald } from "/sdk/herald.js";
//   const herald = new Herald({ urls: ["https://herald.example"], getToken });
//   const view = herald.tail("orders.eu", { from: "latest", onMessage, onGap });
//   const work = herald.subscribe("orders-ui", { credit: 10, onMessage: (m) => m.ack() });
//
// Tails resume gap-free: the SDK keeps, per partition, the next offset it expects (in
// memory, and in sessionStorage when asked), reconnects with jittered backoff, reopens
// the tail at the lowest of those offsets and drops what it has already shown. A
// position the log no longer holds (retention passed) is reported once by `onGap` with
// the first and last missing offsets of that partition. Durable subscriptions hand each
// record to `onMessage` with ack/nack/extend, and give one credit back per record as
// the application takes it. A socket closed 4401 (a browser token expired) asks
// `getToken` for a fresh token before reconnecting. `stats()` is the server's stats
// stream (a snapshot a second) with the same reconnect, backoff and token handling.
// Given a cluster's node URLs (PROTOCOL §7: any node serves everything), sockets move
// to the next node on each reconnect (a node that died, or closed them with 1012 when
// a subscription's coordinator died), and HTTP calls go on at the next node when one
// cannot be reached or answers 503 cluster_unavailable.

const FATAL = new Set([4400, 4403, 4404, 4409, 4410, 1008]);

/** Why a tail or subscription stopped for good (a close code the SDK must not retry). */
export class HeraldError extends Error {
  constructor(message, code) {
    super(message);
    this.name = "HeraldError";
    this.code = code;
  }
}

// A browser cannot set headers on a WebSocket: the token goes as the subprotocol
// `herald.token.<token>` beside `herald.v1`, which the server selects (docs/protocol.md),
// so it stays out of URLs and logs. A token that is not a valid subprotocol name (not a
// Herald token) falls back to `?token=`.
const SUBPROTOCOL = "herald.v1";
const PROTOCOL_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

function openSocket(url, token) {
  if (!token) return new WebSocket(url, [SUBPROTOCOL]);
  if (PROTOCOL_NAME.test(token)) return new WebSocket(url, [SUBPROTOCOL, `herald.token.${token}`]);
  const withToken = new URL(url);
  withToken.searchParams.set("token", token);
  return new WebSocket(withToken.toString(), [SUBPROTOCOL]);
}

function wsUrl(base, path, params) {
  const url = new URL(path, base);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
  return url.toString();
}

export class Herald {
  /**
   * @param {object} options
   * @param {string|string[]} options.urls one server URL or the nodes of a cluster
   * @param {string} [options.token] a token to start with
   * @param {() => Promise<string>|string} [options.getToken] fresh tokens (on start when
   *   no token is given, and after a 4401)
   * @param {number} [options.minBackoffMs=250] @param {number} [options.maxBackoffMs=10000]
   */
  constructor(options) {
    const urls = typeof options.urls === "string" ? [options.urls] : options.urls || [options.url];
    if (!urls.length || !urls[0]) throw new TypeError("Herald: urls is required");
    this.urls = urls.map((u) => u.replace(/\/+$/, ""));
    this.token = options.token || null;
    this.getToken = options.getToken || null;
    this.minBackoffMs = options.minBackoffMs ?? 250;
    this.maxBackoffMs = options.maxBackoffMs ?? 10000;
    this._next = 0;
  }

  /** The next URL to try (round robin over the list, moving on after each failure). */
  _url(advance) {
    if (advance) this._next = (this._next + 1) % this.urls.length;
    return this.urls[this._next];
  }

  /** Ask getToken; `refused` is true (with the token the server refused) after a 401/4401. */
  async _freshToken(refused = false, previous = null) {
    if (this.getToken) this.token = (await this.getToken({ refused, token: previous })) || null;
    return this.token;
  }

  async _headers() {
    if (!this.token && this.getToken) await this._freshToken();
    return this.token ? { Authorization: `Bearer ${this.token}` } : {};
  }

  /**
   * fetch() at the current node, moving on to the next when one cannot be reached or
   * answers 503 cluster_unavailable (it cannot reach the cluster's etcd; another may):
   * each node is tried once. A publish retried that way may be stored twice unless
   * its messages carry an `id` (PROTOCOL §2 dedup).
   */
  async _fetch(path, init) {
    let failure;
    for (let tried = 0; tried < this.urls.length; tried += 1) {
      const last = tried === this.urls.length - 1;
      try {
        const response = await fetch(`${this._url(false)}${path}`, init);
        if (response.status === 503 && !last && (await problemCode(response.clone())) === "cluster_unavailable") {
          this._url(true);
          continue;
        }
        return response;
      } catch (error) {
        failure = error; // unreachable: the next node
        this._url(true);
      }
    }
    throw failure;
  }

  /** GET /v1/topics/{topic}: its partitions' start and end offsets. */
  async topic(name, retried = false) {
    const response = await this._fetch(`/v1/topics/${encodeURIComponent(name)}`, {
      headers: await this._headers(),
    });
    if (response.status === 401 && this.getToken && !retried) {
      await this._freshToken(true, this.token); // an expired token: once more with a fresh one
      return this.topic(name, true);
    }
    if (!response.ok) throw new HeraldError(`topic ${name}: HTTP ${response.status}`, response.status);
    return response.json();
  }

  /**
   * Publish records: `messages` as in PROTOCOL §2 ([{value}, {key, value}, …]); a
   * message with `delay_ms` is sent to subscriptions no earlier than its `deliver_at`
   * (PROTOCOL §8), which the records delivered, tailed or read then carry.
   */
  async publish(topic, messages) {
    const response = await this._fetch(`/v1/topics/${encodeURIComponent(topic)}/messages`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...(await this._headers()) },
      body: JSON.stringify({ messages }),
    });
    if (!response.ok) throw new HeraldError(`publish to ${topic}: HTTP ${response.status}`, response.status);
    return response.json();
  }

  tail(topic, options = {}) {
    return new Tail(this, topic, options);
  }

  subscribe(subscription, options = {}) {
    return new Subscription(this, subscription, options);
  }

  /** The stats stream (GET /v1/stats/ws): `onSnapshot` gets a snapshot a second. */
  stats(options = {}) {
    return new StatsStream(this, options);
  }
}

/** One reconnecting WebSocket: the shared part of tails and subscriptions. */
class Stream {
  constructor(herald, options) {
    this.herald = herald;
    this.onState = options.onState || (() => {});
    this.onError = options.onError || ((e) => console.warn("herald:", e.message));
    this.closed = false;
    this.socket = null;
    this._attempt = 0;
    this._timer = null;
    queueMicrotask(() => this._open());
  }

  close() {
    this.closed = true;
    clearTimeout(this._timer);
    if (this.socket) this.socket.close(1000);
    this.onState("closed");
  }

  async _open() {
    if (this.closed) return;
    let url;
    try {
      if (!this.herald.token && this.herald.getToken) await this.herald._freshToken();
      // The node is read after the URL's own requests: a tail's topic lookup may have
      // moved on from an unreachable node, and its socket must go where the lookup went.
      url = await this._socketUrl();
    } catch (error) {
      this._retry(error);
      return;
    }
    if (this.closed) return;
    this.onState("connecting");
    const socket = openSocket(url, this.herald.token);
    this.socket = socket;
    socket.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      if (frame.type === "ready") {
        this._attempt = 0;
        this.onState("open");
      }
      this._frame(frame);
    };
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (this.closed) return;
      if (FATAL.has(event.code)) {
        this.closed = true;
        this.onState("closed");
        this.onError(new HeraldError(`closed ${event.code} ${event.reason}`, event.code));
        return;
      }
      if (event.code === 4401) {
        // A token expired (or was never given): ask for a fresh one, then reconnect.
        const refused = this.herald.token;
        this.herald.token = null;
        this._retry(null, true, refused);
        return;
      }
      this._retry(new HeraldError(`connection lost (${event.code})`, event.code));
    };
  }

  _retry(error, needToken = false, refused = null) {
    if (this.closed) return;
    if (error) this.onError(error);
    this.onState("reconnecting");
    const ceiling = Math.min(this.herald.maxBackoffMs, this.herald.minBackoffMs * 2 ** this._attempt);
    const delay = needToken && this._attempt === 0 ? 0 : Math.random() * ceiling; // full jitter
    this._attempt += 1;
    if (!needToken) this.herald._url(true); // the next node of a cluster
    this._timer = setTimeout(async () => {
      if (needToken && this.herald.getToken) {
        try {
          await this.herald._freshToken(true, refused);
        } catch (e) {
          this._retry(e, true, refused);
          return;
        }
      }
      this._open();
    }, delay);
  }

  _send(frame) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }
}

/** A live view of a topic that resumes where it was (see the module comment). */
export class Tail extends Stream {
  constructor(herald, topic, options) {
    super(herald, options);
    this.topic = topic;
    this.from = options.from ?? "latest";
    this.credit = options.credit ?? 500;
    this.onMessage = options.onMessage || (() => {});
    this.onGap = options.onGap || (() => {});
    this.storage = options.storage === true ? globalThis.sessionStorage : options.storage || null;
    this.storageKey = options.storageKey || `herald.tail.${topic}`;
    /** partition -> the next offset expected */
    this.positions = new Map();
    this.paused = false;
    this._owed = 0; // credit not given back yet (withheld while paused, or batched)
    const saved = this.storage && this.storage.getItem(this.storageKey);
    if (saved) {
      try {
        for (const [p, o] of Object.entries(JSON.parse(saved))) this.positions.set(Number(p), o);
      } catch {
        /* a corrupt entry: start from `from` */
      }
    }
  }

  async _socketUrl() {
    // Learn every partition's range: the starting positions of a first connect, and
    // the positions retention has passed since (a gap, reported before any record).
    const info = await this.herald.topic(this.topic);
    const first = this.positions.size === 0;
    for (const { partition, start_offset: start, end_offset: end } of info.partitions) {
      let next = this.positions.get(partition);
      if (next === undefined) {
        if (!first) next = start; // a partition added since: from its start
        else if (this.from === "earliest") next = start;
        else if (typeof this.from === "number") next = Math.min(Math.max(this.from, start), end);
        else next = end;
        if (typeof this.from === "number" && first && this.from < start) this._gap(partition, this.from, start - 1);
      } else if (next < start) {
        this._gap(partition, next, start - 1);
        next = start;
      }
      this.positions.set(partition, next);
    }
    this._save();
    this._owed = 0; // a new socket starts with full credit
    const lowest = Math.min(...this.positions.values());
    return wsUrl(this.herald._url(false), `/v1/topics/${encodeURIComponent(this.topic)}/ws`, {
      from: Number.isFinite(lowest) ? lowest : "latest",
      credit: this.credit,
      positions: true,
    });
  }

  _ready(frame) {
    // Where the server really starts each partition: retention may have passed our
    // position between the lookup above and the socket's open (docs/protocol.md §3).
    for (const [p, start] of Object.entries(frame.positions || {})) {
      const partition = Number(p);
      const next = this.positions.get(partition);
      if (next === undefined || start <= next) continue;
      this._gap(partition, next, start - 1);
      this.positions.set(partition, start);
    }
    this._save();
  }

  _gap(partition, first, last) {
    if (last < first) return;
    try {
      this.onGap({ topic: this.topic, partition, first, last });
    } catch (e) {
      this.onError(e);
    }
  }

  _frame(frame) {
    if (frame.type === "ready") this._ready(frame);
    if (frame.type !== "deliver") return;
    for (const record of frame.messages) {
      const next = this.positions.get(record.partition);
      if (next !== undefined && record.offset < next) continue; // shown already
      if (next !== undefined && record.offset > next) this._gap(record.partition, next, record.offset - 1);
      this.positions.set(record.partition, record.offset + 1);
      try {
        this.onMessage(record);
      } catch (e) {
        this.onError(e);
      }
    }
    this._save();
    // Credit goes back in batches of a quarter of the window (one frame up for several
    // down, the server still holding three quarters to send on): a browser's cost is
    // per WebSocket message.
    this._owed += frame.messages.length;
    if (!this.paused && this._owed >= Math.max(1, Math.floor(this.credit / 4)) && this._send({ type: "credit", n: this._owed }))
      this._owed = 0;
  }

  /** Stop granting credit: at most `credit` more records arrive until resume(). */
  pause() {
    this.paused = true;
  }

  /** Grant the credit withheld while paused. */
  resume() {
    this.paused = false;
    if (this._owed && this._send({ type: "credit", n: this._owed })) this._owed = 0;
  }

  _save() {
    if (this.storage) this.storage.setItem(this.storageKey, JSON.stringify(Object.fromEntries(this.positions)));
  }
}

/** A durable consumer of a subscription: at-least-once, acked by the application. */
export class Subscription extends Stream {
  constructor(herald, name, options) {
    super(herald, options);
    this.name = name;
    this.credit = options.credit ?? 10;
    this.onMessage = options.onMessage || (() => {});
    this._queue = Promise.resolve(); // frames are handled one after the other, in order
  }

  async _socketUrl() {
    return wsUrl(this.herald._url(false), `/v1/subscriptions/${encodeURIComponent(this.name)}/ws`, {
      credit: this.credit,
    });
  }

  /** Done with these records (message ids or records). */
  ack(ids) {
    return this._send({ type: "ack", ids: ids.map(idOf) });
  }

  /** Redeliver these records, after `delayMs` or the subscription's backoff. */
  nack(ids, delayMs) {
    return this._send({ type: "nack", ids: ids.map(idOf), ...(delayMs === undefined ? {} : { delay_ms: delayMs }) });
  }

  /** Push the ack deadline of these records to now + ms. */
  extend(ids, ms) {
    return this._send({ type: "extend", ids: ids.map(idOf), ms });
  }

  _frame(frame) {
    if (frame.type !== "deliver") return;
    const socket = this.socket;
    this._queue = this._queue.then(() => this._deliver(frame.messages, socket));
  }

  async _deliver(records, socket) {
    // Each record belongs to the socket that delivered it. Once that socket is gone
    // the server gives its records back for redelivery (PROTOCOL §3): those not yet
    // handed over are dropped (they come again), a nack or extend of one is not sent
    // (it would take the record from whoever holds it now), and no credit is given
    // for it to the next socket (which starts with its own). An ack is by record id
    // and counts on any socket.
    const live = () => this.socket === socket;
    for (const record of records) {
      if (!live()) return;
      const message = {
        ...record,
        id: idOf(record),
        ack: () => this.ack([record]),
        nack: (delayMs) => live() && this.nack([record], delayMs),
        extend: (ms) => live() && this.extend([record], ms),
      };
      try {
        await this.onMessage(message);
      } catch (e) {
        this.onError(e);
      }
      if (live()) this._send({ type: "credit", n: 1 }); // taken: the server may send one more
    }
  }
}

/** The server's stats stream: one snapshot a second (docs/protocol.md "Stats"). */
export class StatsStream extends Stream {
  constructor(herald, options) {
    super(herald, options);
    this.onSnapshot = options.onSnapshot || (() => {});
    this._live = false;
  }

  async _socketUrl() {
    this._live = false;
    return wsUrl(this.herald._url(false), "/v1/stats/ws", {});
  }

  _frame(frame) {
    if (frame.type !== "stats") return;
    if (!this._live) {
      // This socket has no "ready" frame: its first snapshot is the sign it is open.
      this._live = true;
      this._attempt = 0;
      this.onState("open");
    }
    try {
      this.onSnapshot(frame);
    } catch (e) {
      this.onError(e);
    }
  }
}

/** The `code` of a problem JSON answer, or null. */
async function problemCode(response) {
  try {
    return (await response.json()).code ?? null;
  } catch {
    return null;
  }
}

function idOf(record) {
  return typeof record === "string" ? record : record.id || `${record.partition}-${record.offset}`;
}
