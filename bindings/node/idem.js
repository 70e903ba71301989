// idem-engine for Node: idem's executor (Rust, through napi-rs) in this
// process. This file gives the native classes (native.js) the package's
// API; every decision (key rules, fingerprints, leases, retries, fencing,
// steps) is the engine's.

"use strict";

const native = require("./native.js");
const {
  IdemError,
  InProgress,
  InvalidInput,
  InvalidStep,
  KeyExpired,
  LeaseLost,
  Mismatch,
  ReplayedFailure,
  ResultTooLarge,
  StepInDoubt,
  Terminal,
  Unavailable,
  call,
  encoded,
  failureOf,
  sync,
} = require("./errors.js");

/** The fingerprint the engine takes of a JSON value (SHA-256 of its canonical JSON). */
function fingerprintOf(value) {
  return sync(() => native.fingerprint(JSON.stringify(value)));
}

/**
 * A run as its handler sees it: pass `fence` to downstream writes that
 * refuse an older holder's, call `check()` before an irreversible step, and
 * journal side effects with `step`. `signal` is aborted once the lease is
 * known lost; `check()` throws `LeaseLost` then. A request that passed
 * through the HTTP middleware unguarded has no run: `fence` is null and
 * `step` throws.
 */
class RunContext {
  constructor(what, context) {
    this.what = what;
    this.native = context;
    this.lost = null;
    this.watch = null;
    this.ended = false;
  }

  /**
   * Aborted once the lease is known lost. Made on first use: the engine's
   * heartbeat runs on its own threads, and only a run whose handler asks
   * for the signal is watched (every 50 ms) for what it found.
   */
  get signal() {
    if (this.lost == null) {
      this.lost = new AbortController();
      if (this.native != null && !this.ended) {
        const look = () => {
          if (!this.native.leaseLost) return false;
          this.lost.abort(new LeaseLost(`${this.what}: the lease was lost`));
          clearInterval(this.watch);
          return true;
        };
        if (!look()) {
          this.watch = setInterval(look, 50);
          this.watch.unref();
        }
      }
    }
    return this.lost.signal;
  }

  /** The fencing number, for writes that refuse an older holder's. */
  get fence() {
    return this.native?.fence ?? null;
  }

  /** Which attempt of the key this is (1 for the first). */
  get attempt() {
    return this.native?.attempt ?? null;
  }

  /** Whether this run took the key over from a stalled or dead worker. */
  get takeover() {
    return this.native?.takeover ?? false;
  }

  /** Whether the lease is known lost. */
  get leaseLost() {
    return this.native?.leaseLost ?? false;
  }

  /** Throws `LeaseLost` once the lease is known lost. */
  check() {
    if (this.native != null) sync(() => this.native.check());
  }

  /** Stops watching the lease: the run has ended. */
  unwatch() {
    this.ended = true;
    if (this.watch != null) clearInterval(this.watch);
  }

  /**
   * Sends a message through the engine's outbox (`new Idem({ outbox })`):
   * held until the run ends, stored with its result in the same write, sent
   * after it, and never again when a duplicate is replayed; a run that fails
   * or is released sends nothing. `destination` is the broker's (an SQS
   * queue URL, a RabbitMQ routing key); `payload` is a Buffer, a string
   * (UTF-8), or a value sent as JSON. Returns the message's id (a UUIDv7):
   * the broker's deduplication id and the `Idempotency-Key` a consumer
   * downstream keys on. Throws `InvalidInput` without an outbox, for a
   * malformed or oversize message, or after the run ended.
   */
  send(destination, payload, headers = {}) {
    if (this.native == null) throw new IdemError(`${this.what}: there is no run to act on`);
    let body;
    if (Buffer.isBuffer(payload) || payload instanceof Uint8Array) body = Buffer.from(payload);
    else if (typeof payload === "string") body = Buffer.from(payload, "utf8");
    else {
      const [json, reason] = encoded(payload);
      if (json === undefined) throw new InvalidInput(`the message's payload: ${reason}`);
      body = Buffer.from(json, "utf8");
    }
    return sync(() => this.native.send(destination, body, Object.entries(headers)));
  }

  /**
   * A journaled step: runs `fn(downstreamKey)` once across every attempt of
   * the run and returns its (JSON) result, from the journal when an earlier
   * attempt finished it. In doubt (an earlier attempt began it and never
   * finished): "retry" runs it again with the same key, "skip" returns null,
   * "park" throws `StepInDoubt`. A name used twice in one run throws
   * `InvalidStep`.
   */
  async step(name, fn, policy = "retry") {
    if (this.native == null) throw new IdemError(`${this.what}: there is no run to act on`);
    const begun = await call(() => this.native.beginStep(name, policy));
    if (begun === null || typeof begun === "string") {
      return begun === null ? null : JSON.parse(begun);
    }
    const value = await fn(begun.key);
    const [json, reason] = encoded(value);
    if (json === undefined) throw new InvalidInput(`step ${JSON.stringify(name)}: ${reason}`);
    await call(() => begun.finish(json));
    return value;
  }
}

/**
 * A claimed run: do the work (see `RunContext`), and end it with
 * `complete`, `fail` or `release`.
 */
class Run extends RunContext {
  constructor(scope, key, run) {
    super(`${scope}/${key}`, run.context);
    this.scope = scope;
    this.key = key;
    this.held = run;
    this.ended = false;
  }

  ending() {
    if (this.ended) throw new IdemError(`${this.scope}/${this.key}: the run has already ended`);
    this.ended = true;
    this.unwatch();
  }

  /** Stores `value` (JSON) and replays it to every later call with the key. */
  async complete(value) {
    this.ending();
    const [json, reason] = encoded(value);
    await call(() => this.held.complete(json, reason));
  }

  /** Records a failure: "retryable" (the default), "terminal" or "unknown". */
  async fail(message, failureClass = "retryable") {
    this.ending();
    return call(() => this.held.fail(message, failureClass));
  }

  /** Gives the claim back without an outcome: the next claim runs the work. */
  async release() {
    this.ending();
    await call(() => this.held.release());
  }
}

/**
 * idem's executor, in this process, over the store at `url`: `sqlite:PATH`
 * (the default, `sqlite:idem.db`), `redis://`, `redis+cluster://`,
 * `postgres://`, `dynamodb://TABLE`, `memory:`, or `http(s)://` for a remote
 * `idem serve` (with `token`).
 */
class Idem {
  constructor(options = {}) {
    const { url = "sqlite:idem.db", scope = "default", ...rest } = options;
    this.scope = scope;
    this.engine = sync(
      () =>
        new native.Engine(url, {
          token: rest.token,
          leaseMs: rest.leaseMs,
          retentionMs: rest.retentionMs,
          failureRetentionMs: rest.failureRetentionMs,
          waitMs: rest.waitMs,
          maxAttempts: rest.maxAttempts,
          maxResultBytes: rest.maxResultBytes,
          keyring: rest.keyring,
          keySecret: rest.keySecret,
          outbox: rest.outbox,
        }),
    );
  }

  /** The store's URL, its password hidden. */
  get url() {
    return this.engine.url;
  }

  /**
   * Claims `key`: `{ replayed: true, value }` if it ran before, else a `Run`
   * to do and end.
   */
  async claim(key, options = {}) {
    const scope = options.scope ?? this.scope;
    const fingerprint = options.fingerprint === undefined ? undefined : JSON.stringify(options.fingerprint);
    const begun = await call(() => this.engine.begin(scope, key, fingerprint, options.waitMs));
    if (typeof begun === "string") return { replayed: true, value: JSON.parse(begun) };
    return new Run(scope, key, begun);
  }

  /**
   * Runs `fn` once for `key`: the first call runs it and stores its (JSON)
   * result; every later call gets that result back without running it. An
   * error out of `fn` is rethrown: a `Terminal` one is stored and replayed
   * (as `ReplayedFailure`), any other releases the key for the next call.
   */
  async withIdempotency(key, fn, options = {}) {
    const run = await this.claim(key, options);
    if (!(run instanceof Run)) return { kind: "replayed", value: run.value };
    let value;
    try {
      value = await fn(run);
    } catch (error) {
      if (!run.ended) {
        try {
          if (error instanceof LeaseLost) run.ending();
          else await run.fail(...failureOf(error));
        } catch (failed) {
          // The handler's own error says more; an unrecorded failure
          // leaves the claim to run out, as a crash would.
          if (!(failed instanceof IdemError)) throw failed;
        }
      }
      throw error;
    }
    await run.complete(value);
    return { kind: "executed", value, fence: run.fence, attempt: run.attempt, takeover: run.takeover };
  }

  /** The record of `key` as stored, or undefined if there is none. */
  async record(key, scope = this.scope) {
    const json = await call(() => this.engine.record(scope, key));
    return json == null ? undefined : JSON.parse(json);
  }
}

module.exports = {
  Idem,
  Run,
  RunContext,
  fingerprintOf,
  IdemError,
  InProgress,
  InvalidInput,
  InvalidStep,
  KeyExpired,
  LeaseLost,
  Mismatch,
  ReplayedFailure,
  ResultTooLarge,
  StepInDoubt,
  Terminal,
  Unavailable,
};
