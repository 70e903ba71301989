/**
 * idem-engine: exactly-once effects over at-least-once delivery. idem's own
 * executor (Rust) runs in this process, over SQLite (the default), Redis,
 * PostgreSQL, DynamoDB or a remote idem serve.
 *
 * ```ts
 * const idem = new Idem({ url: "sqlite:idem.db", scope: "charges" });
 * const outcome = await idem.withIdempotency(order.id, (run) => charge(order, run.fence));
 * ```
 */

/** The call ran now: `value` is what the function returned. */
export interface Executed<T> {
  kind: "executed";
  value: T;
  fence: number;
  attempt: number;
  takeover: boolean;
}

/** The call ran before: `value` is its stored result, as JSON decodes it. */
export interface Replayed<T> {
  kind: "replayed";
  value: T;
}

/** What a call with a key did. */
export type Outcome<T> = Executed<T> | Replayed<T>;

/** The store, and the defaults of every call. */
export interface IdemOptions {
  /** sqlite:PATH (default sqlite:idem.db), redis://, redis+cluster://, postgres://, mysql://, dynamodb://TABLE, memory:, http(s):// (idem serve). */
  url?: string;
  /** The token for a remote idem serve. */
  token?: string;
  /** The scope of calls that do not name one [default: "default"]. */
  scope?: string;
  /** How long a claim is held without a heartbeat, ms [default: 30000]; the engine extends it every third. */
  leaseMs?: number;
  /** How long results are kept, ms [default: a day]. */
  retentionMs?: number;
  /** How long terminal failures are kept, ms [default: the retention]. */
  failureRetentionMs?: number;
  /** How long a claim waits for a duplicate in flight, ms [default: 0]. */
  waitMs?: number;
  /** Attempts after which a retryable failure is terminal [default: 5]. */
  maxAttempts?: number;
  /** The largest result stored, bytes [default: 1 MiB]. */
  maxResultBytes?: number;
  /** A keyring file (`id:64-hex-digits` a line, newest first) sealing stored results at rest [default: none]. */
  keyring?: string;
  /** A file holding the secret (64 hex digits) keys are hashed with at rest [default: none]. */
  keySecret?: string;
  /**
   * The broker what runs send goes to (`RunContext.send`): `sqs://?endpoint=URL&region=R`
   * (credentials from the environment) or `amqp://…` (RabbitMQ) [default: none].
   * Over `idem serve` the server sends (`idem serve --outbox URL`): `send` works
   * without it, and one given is refused.
   */
  outbox?: string;
}

/** Options of one call. */
export interface CallOptions {
  /** The scope [default: the Idem's]. */
  scope?: string;
  /** A JSON value that must stay the same under the key (the request). */
  fingerprint?: unknown;
  /** Wait up to this long for a running duplicate's outcome, ms. */
  waitMs?: number;
}

/** What a step does when an earlier attempt began it and never finished. */
export type StepPolicy = "retry" | "skip" | "park";

/** How a failure is recorded. */
export type FailureClass = "retryable" | "terminal" | "unknown";

/** What `fail` recorded. */
export interface Failed {
  class: FailureClass;
  attempt: number;
  retryAfterMs?: number | null;
}

/**
 * A run as its handler sees it. A request that passed through the HTTP
 * middleware unguarded has no run: `fence` is null and `step` throws.
 */
export class RunContext {
  /** Aborted once the lease is known lost. */
  readonly signal: AbortSignal;
  /** The fencing number, for writes that refuse an older holder's. */
  readonly fence: number | null;
  /** Which attempt of the key this is (1 for the first). */
  readonly attempt: number | null;
  /** Whether this run took the key over from a stalled or dead worker. */
  readonly takeover: boolean;
  /** Whether the lease is known lost. */
  readonly leaseLost: boolean;
  /** Throws `LeaseLost` once the lease is known lost. */
  check(): void;
  /**
   * Sends a message after the run's completion is stored (the outbox), never
   * again for a replayed duplicate: its id (a UUIDv7).
   */
  send(destination: string, payload: Buffer | Uint8Array | string | unknown, headers?: Record<string, string>): string;
  /** A journaled step: `fn(downstreamKey)` runs once across every attempt. */
  step<T>(name: string, fn: (downstreamKey: string) => T | Promise<T>, policy?: StepPolicy): Promise<T>;
}

/** A claimed run, held by the engine's heartbeat until it is ended. */
export class Run extends RunContext {
  readonly scope: string;
  readonly key: string;
  /** The fencing number, for writes that refuse an older holder's. */
  readonly fence: number;
  /** Which attempt of the key this is (1 for the first). */
  readonly attempt: number;
  /** Stores `value` (JSON) and replays it to every later call with the key. */
  complete(value: unknown): Promise<void>;
  /** Records a failure [default: "retryable"]. */
  fail(message: string, failureClass?: FailureClass): Promise<Failed>;
  /** Gives the claim back without an outcome. */
  release(): Promise<void>;
}

/** idem's executor over one store, in this process. */
export class Idem {
  constructor(options?: IdemOptions);
  /** The store's URL, its password hidden. */
  readonly url: string;
  /** Claims `key`: its stored result if it ran before, else a `Run` to do and end. */
  claim(key: string, options?: CallOptions): Promise<Run | { replayed: true; value: unknown }>;
  /** Runs `fn` once for `key`; later calls get its stored result. */
  withIdempotency<T>(key: string, fn: (run: Run) => T | Promise<T>, options?: CallOptions): Promise<Outcome<T>>;
  /** The record of `key` as stored, or undefined. */
  record(key: string, scope?: string): Promise<Record<string, any> | undefined>;
}

/** The fingerprint the engine takes of a JSON value. */
export function fingerprintOf(value: unknown): string;

/** Anything idem throws. */
export class IdemError extends Error {}
/** Throw it from a handler for a failure stored and replayed, never retried. */
export class Terminal extends Error {}
/** A value idem was given breaks a rule (URL, key, setting, JSON). */
export class InvalidInput extends IdemError {}
/** The store could not be opened, or did not answer for a whole lease. */
export class Unavailable extends IdemError {}
/** Another holder runs the key right now. */
export class InProgress extends IdemError {
  readonly retryAfterMs: number;
}
/** The key was first used with another fingerprint. */
export class Mismatch extends IdemError {}
/** The key ran before and its record expired; the store remembers it: refused, not run again. */
export class KeyExpired extends IdemError {
  /** How long ago the key ran, at least, in milliseconds. */
  readonly ageMs: number;
}
/** An earlier run of the key failed for good; its failure is replayed. */
export class ReplayedFailure extends IdemError {
  readonly failureClass: FailureClass;
  readonly failure: string;
}
/** The claim is no longer held; nothing was written. */
export class LeaseLost extends IdemError {}
/** The result is over the store's limit; the key is recorded as failed. */
export class ResultTooLarge extends IdemError {}
/** A step in doubt under the "park" policy. */
export class StepInDoubt extends IdemError {
  readonly step: string;
  readonly attempt: number;
}
/** A step misused: its name is invalid or already used in this run. */
export class InvalidStep extends IdemError {}
