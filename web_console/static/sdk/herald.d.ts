// Types of herald.js (docs/browser.md).

/** A record as PROTOCOL §1 delivers it. */
export interface HeraldRecord {
  topic: string;
  partition: number;
  offset: number;
  timestamp: number;
  /** timestamp + delay_ms of a record published with a delay (PROTOCOL §8); absent otherwise. */
  deliver_at?: number;
  key?: string;
  value?: unknown;
  value_b64?: string;
  headers?: Record<string, string>;
  id?: string;
  attempt?: number;
  subscription?: string | null;
}

/** A message to publish (PROTOCOL §2; `delay_ms` 0..2592000000, PROTOCOL §8). */
export interface PublishMessage {
  value?: unknown;
  value_b64?: string;
  key?: string | null;
  headers?: Record<string, string>;
  partition?: number;
  id?: string;
  /** Appended at once, sent to subscriptions no earlier than timestamp + delay_ms. */
  delay_ms?: number;
}

/** Offsets a tail will never see: retention deleted them before it resumed. */
export interface Gap {
  topic: string;
  partition: number;
  first: number;
  last: number;
}

export type StreamState = "connecting" | "open" | "reconnecting" | "closed";

export interface HeraldOptions {
  /**
   * One server URL, or the nodes of a cluster (PROTOCOL §7): sockets move to the next
   * on each reconnect; HTTP calls go on at the next when one cannot be reached or
   * answers 503 cluster_unavailable.
   */
  urls: string | string[];
  /** A token to start with (a browser token from your backend). */
  token?: string;
  /**
   * Called for a token at start (when none is given; `refused` false) and after a
   * close 4401 or an HTTP 401 (`refused` true, `token` the token the server refused).
   */
  getToken?: (info: { refused: boolean; token: string | null }) => string | Promise<string>;
  minBackoffMs?: number;
  maxBackoffMs?: number;
}

interface StreamOptions {
  onState?: (state: StreamState) => void;
  onError?: (error: Error) => void;
}

export interface TailOptions extends StreamOptions {
  /** Where a first connect starts: "latest" (default), "earliest" or an offset. */
  from?: "latest" | "earliest" | number;
  /** Records in flight to the page at once (given back as onMessage returns). */
  credit?: number;
  onMessage?: (record: HeraldRecord) => void;
  onGap?: (gap: Gap) => void;
  /** Keep resume positions across reloads: true for sessionStorage, or a Storage. */
  storage?: boolean | Storage;
  storageKey?: string;
}

export interface Message extends HeraldRecord {
  id: string;
  ack(): boolean;
  /** false (not sent) once the socket that delivered the record is gone. */
  nack(delayMs?: number): boolean;
  /** false (not sent) once the socket that delivered the record is gone. */
  extend(ms: number): boolean;
}

export interface SubscribeOptions extends StreamOptions {
  /** Records handed out and not yet taken by onMessage (default 10). */
  credit?: number;
  /** One record at a time, in order; a credit goes back when it returns (or resolves). */
  onMessage?: (message: Message) => void | Promise<void>;
}

export declare class HeraldError extends Error {
  code: number;
}

declare class Stream {
  close(): void;
}

export declare class Tail extends Stream {
  readonly topic: string;
  /** partition -> next offset expected */
  readonly positions: Map<number, number>;
  readonly paused: boolean;
  /** Stop granting credit: at most `credit` more records arrive until resume(). */
  pause(): void;
  /** Grant the credit withheld while paused. */
  resume(): void;
}

export interface StatsOptions extends StreamOptions {
  /** A stats snapshot (docs/protocol.md "Stats"), about one a second. */
  onSnapshot?: (snapshot: { type: "stats"; [field: string]: unknown }) => void;
}

/** The stats stream; its state is "open" once the first snapshot arrived. */
export declare class StatsStream extends Stream {}

export declare class Subscription extends Stream {
  readonly name: string;
  ack(ids: Array<string | HeraldRecord>): boolean;
  nack(ids: Array<string | HeraldRecord>, delayMs?: number): boolean;
  extend(ids: Array<string | HeraldRecord>, ms: number): boolean;
}

export declare class Herald {
  constructor(options: HeraldOptions);
  token: string | null;
  tail(topic: string, options?: TailOptions): Tail;
  subscribe(subscription: string, options?: SubscribeOptions): Subscription;
  /** GET /v1/stats/ws (needs the metrics or admin right); reconnects like a tail. */
  stats(options?: StatsOptions): StatsStream;
  publish(topic: string, messages: PublishMessage[]): Promise<unknown>;
  topic(name: string): Promise<unknown>;
}
