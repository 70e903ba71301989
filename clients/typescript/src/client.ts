/** The client: `withIdempotency(key, fn)` over a claim of idem serve. */

import { createHash } from "node:crypto";

import { ApiError, IdemError, InProgress, LeaseLost, Mismatch, ReplayedFailure, Terminal } from "./errors.js";
import { Run } from "./run.js";
import { Transport } from "./transport.js";

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

/** How to reach idem serve, and the defaults of every call. */
export interface IdemOptions {
  /** idem serve's address, e.g. http://127.0.0.1:8700. */
  url: string;
  /** One of the server's --tokens (none for a server without them). */
  token?: string;
  /** The scope of calls that do not name one [default: "default"]. */
  scope?: string;
  /** How long a claim is held without a heartbeat, ms [default: 30000]. */
  leaseMs?: number;
  /** How long outcomes are kept, ms [default: the server's --retention]. */
  retentionMs?: number;
  /** Per-request timeout, ms [default: 10000]. */
  timeoutMs?: number;
  /** Tries after a lost connection or a 503 [default: 4]. */
  retries?: number;
}

/** Options of one call. */
export interface CallOptions {
  /** The scope [default: the client's]. */
  scope?: string;
  /** A JSON value that must stay the same under the key (the request). */
  fingerprint?: unknown;
  /** Wait up to this long for a running duplicate's outcome, ms. */
  waitMs?: number;
}

/** SHA-256 of the value's JSON with sorted object keys. */
export function fingerprintOf(value: unknown): string {
  return createHash("sha256").update(canonical(value)).digest("hex");
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(value ?? null);
}

function whole(ms: number, name: string): number {
  const n = Math.round(ms);
  if (!Number.isFinite(n) || n < 1) throw new RangeError(`${name} must be at least 1 ms, got ${ms}`);
  return n;
}

/** A client of idem serve. */
export class Idem {
  private readonly transport: Transport;
  private readonly scope: string;
  private readonly leaseMs: number;
  private readonly retentionMs: number | undefined;

  constructor(options: IdemOptions) {
    this.transport = new Transport(options.url, options.token, options.timeoutMs ?? 10_000, options.retries ?? 4);
    this.scope = options.scope ?? "default";
    this.leaseMs = whole(options.leaseMs ?? 30_000, "leaseMs");
    this.retentionMs = options.retentionMs === undefined ? undefined : whole(options.retentionMs, "retentionMs");
  }

  /**
   * Runs `fn` once for `key`: the first call runs it and stores its
   * (JSON-encodable) result; every later call with the key gets that result
   * back without running it. While `fn` runs, its lease is extended every
   * third of it. An error out of `fn` is rethrown: a `Terminal` one is stored
   * and replayed (as ReplayedFailure), any other releases the key so the next
   * call runs it again.
   */
  async withIdempotency<T>(key: string, fn: (run: Run) => T | Promise<T>, options: CallOptions = {}): Promise<Outcome<T>> {
    const scope = options.scope ?? this.scope;
    const body: Record<string, unknown> = { scope, key, lease_ms: this.leaseMs };
    if (this.retentionMs !== undefined) body.retention_ms = this.retentionMs;
    if (options.fingerprint !== undefined) body.fingerprint = fingerprintOf(options.fingerprint);
    const waitMs = Math.max(0, Math.round(options.waitMs ?? 0));
    if (waitMs > 0) body.wait_ms = waitMs;
    const sent = performance.now();
    const answer = await this.transport.call("POST", "/v1/claim", body, undefined, waitMs);
    switch (answer.outcome) {
      case "completed":
        return { kind: "replayed", value: answer.response as T };
      case "in_progress":
        throw new InProgress(scope, key, answer.retry_after_ms);
      case "mismatch":
        throw new Mismatch(scope, key);
      case "failed":
        throw new ReplayedFailure(scope, key, answer.class, answer.message);
    }
    const run = new Run(this.transport, scope, key, answer.lease, answer.takeover, this.leaseMs, this.retentionMs, sent);
    await run.ready;
    if (run.signal.aborted) {
      // The claim was lost before the work began: it must not begin.
      run.stop();
      run.check();
    }
    let value: T;
    try {
      value = await fn(run);
    } catch (error) {
      await settle(run, error);
      throw error;
    }
    // The work has run: a result that cannot be stored must not let it run
    // again, so the run ends failed with the reason.
    try {
      JSON.stringify(value ?? null);
    } catch (error) {
      await run.refused(`the result cannot be stored as JSON: ${String(error)}`);
      throw error;
    }
    try {
      await run.complete(value);
    } catch (error) {
      if (error instanceof ApiError && (error.status === 400 || error.status === 413)) {
        await run.refused(`idem serve refused the result: ${error.detail}`);
      }
      throw error;
    }
    return { kind: "executed", value, fence: run.fence, attempt: run.attempt, takeover: run.takeover };
  }

  /** The record of `key` as stored, or undefined if there is none. */
  async record(key: string, scope = this.scope): Promise<Record<string, any> | undefined> {
    try {
      return await this.transport.call("GET", "/v1/record", undefined, { scope, key });
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return undefined;
      throw error;
    }
  }
}

/** Records why `fn` failed, unless the run already ended (a parked step). */
async function settle(run: Run, error: unknown): Promise<void> {
  if (run.finished) return;
  try {
    if (error instanceof LeaseLost) run.stop();
    else if (error instanceof Terminal) await run.fail(error.message || error.name, "terminal");
    else await run.fail(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
  } catch (failed) {
    // The handler's own error says more; an unrecorded failure only leaves
    // the claim to run out, as a crash would.
    if (!(failed instanceof IdemError)) throw failed;
    run.stop();
  }
}
