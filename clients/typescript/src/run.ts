/**
 * One claimed run: its lease kept alive by a heartbeat, its fence, its
 * journaled steps, and the write that ends it.
 */

import { IdemError, LeaseLost, StepInDoubt } from "./errors.js";
import { Transport } from "./transport.js";

/** A held claim as idem serve hands it out; passed back unchanged. */
export interface LeaseJson {
  scope: string;
  key: string;
  token: string;
  fence: number;
  attempt: number;
}

/** What a step does when an earlier attempt started it and never finished. */
export type StepPolicy = "retry" | "park";

/** How a failure is recorded: retried, replayed, or parked for resolution. */
export type FailureClass = "retryable" | "terminal" | "unknown";

/**
 * The run of one key that the caller holds. Pass `fence` to downstream writes
 * that can refuse an older holder's; `signal` is aborted if the lease is lost
 * all the same: taken over, or run out with no extension confirmed (idem
 * serve unreachable, the event loop blocked). Call `check()` before
 * irreversible work: it reads the clock as well, so it is right even when
 * the heartbeat has not run.
 */
export class Run {
  /** Strictly larger for each claim of the key. */
  readonly fence: number;
  /** Which attempt this is (1 for the first). */
  readonly attempt: number;
  /** An earlier attempt's lease ran out: it may have partly run. */
  readonly takeover: boolean;
  /** Aborted when the lease is lost. */
  readonly signal: AbortSignal;
  private readonly lost = new AbortController();
  private readonly timer: NodeJS.Timeout;
  /** Fires when the lease as last confirmed runs out. */
  private deadline: NodeJS.Timeout | undefined;
  /** No more heartbeats: the run's end was written, or it was stopped. */
  private ended = false;
  /** The write that ends the run has begun: no other write may start. */
  private closing = false;
  /**
   * When the lease as last confirmed runs out (`performance.now()` time),
   * measured from when the confirming request was sent.
   */
  private confirmedUntil: number;
  /** Settles once the lease is confirmed fresh enough for the work to start. */
  readonly ready: Promise<void>;

  constructor(
    private readonly transport: Transport,
    readonly scope: string,
    readonly key: string,
    private readonly lease: LeaseJson,
    takeover: boolean,
    private readonly leaseMs: number,
    private readonly retentionMs: number | undefined,
    claimSent: number,
  ) {
    this.fence = lease.fence;
    this.attempt = lease.attempt;
    this.takeover = takeover;
    this.signal = this.lost.signal;
    this.confirmedUntil = claimSent + leaseMs;
    this.armDeadline();
    let beating = false;
    const beat = async (): Promise<void> => {
      if (beating || this.ended) return;
      beating = true;
      const sent = performance.now();
      try {
        // One try within a sixth of the lease: the next beat comes soon enough.
        await this.transport.call("POST", "/v1/extend", { lease: this.lease, lease_ms: this.leaseMs }, undefined, 0, {
          retries: 0,
          timeoutMs: Math.max(200, Math.floor(this.leaseMs / 6)),
        });
        this.confirmedUntil = sent + this.leaseMs;
        this.armDeadline();
      } catch (error) {
        if (error instanceof LeaseLost) {
          this.lost.abort(error);
          clearInterval(this.timer);
        } else {
          this.ranOut();
        }
      } finally {
        beating = false;
      }
    };
    this.timer = setInterval(beat, Math.max(1, Math.floor(leaseMs / 3)));
    this.timer.unref();
    // A claim that waited (or was retried) may have been granted late in its
    // call: confirm the lease before the work starts.
    this.ready = performance.now() - claimSent > leaseMs / 6 ? beat() : Promise.resolve();
  }

  /** Aborts `signal` when the lease as last confirmed runs out, unless a beat confirms it first. */
  private armDeadline(): void {
    clearTimeout(this.deadline);
    if (this.ended || this.signal.aborted) return;
    this.deadline = setTimeout(() => this.ranOut(), Math.max(0, this.confirmedUntil - performance.now()) + 1);
    this.deadline.unref();
  }

  /** Aborts `signal` once the lease as last confirmed has run out; whether it is aborted. */
  private ranOut(): boolean {
    if (!this.signal.aborted && performance.now() >= this.confirmedUntil) {
      this.lost.abort(new LeaseLost(`${this.scope}/${this.key}: no extension was confirmed before the lease ran out`));
    }
    return this.signal.aborted;
  }

  /** Whether the run has been completed, failed or released. */
  get finished(): boolean {
    return this.ended || this.closing;
  }

  /** Throws LeaseLost if the lease was lost. */
  check(): void {
    if (this.ranOut()) throw new LeaseLost(`${this.scope}/${this.key}: the lease was lost; stop`);
  }

  /**
   * A journaled step: runs `fn(downstreamKey)` once across every attempt of
   * the run and returns its (JSON-encodable) result, from the journal when an
   * earlier attempt finished it. Pass `downstreamKey` to an external API that
   * deduplicates. If an earlier attempt died inside the step, "retry" runs it
   * again with the same key; "park" fails the run as unknown and throws
   * StepInDoubt.
   */
  async step<T>(name: string, fn: (downstreamKey: string) => T | Promise<T>, policy: StepPolicy = "retry"): Promise<T> {
    this.held();
    this.check();
    const begun = await this.transport.call("POST", "/v1/steps/begin", { lease: this.lease, step: name });
    if (begun.state === "done") return begun.result as T;
    if (begun.state === "skipped") return null as T;
    if (begun.state === "in_doubt" && policy === "park") {
      await this.fail(`step ${JSON.stringify(name)} in doubt: started by attempt ${begun.attempt}, never finished`, "unknown");
      throw new StepInDoubt(name, begun.attempt);
    }
    const value = await fn(begun.downstream_key);
    await this.transport.call("POST", "/v1/steps/finish", { lease: this.lease, step: name, result: value ?? null });
    return value;
  }

  /** Stores `value`; every later claim of the key gets it back. */
  async complete(value: unknown): Promise<void> {
    const body: Record<string, unknown> = { lease: this.held(), response: value ?? null };
    if (this.retentionMs !== undefined) body.retention_ms = this.retentionMs;
    await this.ending(() => this.transport.call("POST", "/v1/complete", body));
  }

  /** Records a failure: retryable releases the key, the others are replayed. */
  async fail(message: string, failureClass: FailureClass = "retryable"): Promise<void> {
    const body: Record<string, unknown> = { lease: this.held(), class: failureClass, message };
    if (this.retentionMs !== undefined) body.retention_ms = this.retentionMs;
    await this.ending(() => this.transport.call("POST", "/v1/fail", body));
  }

  /** Gives the claim back without an outcome: the next claim runs the work. */
  async release(): Promise<void> {
    const body = { lease: this.held() };
    await this.ending(() => this.transport.call("POST", "/v1/release", body));
  }

  /** Stops the heartbeat without writing: the lease runs out, as in a crash. */
  stop(): void {
    this.ended = true;
    clearInterval(this.timer);
    clearTimeout(this.deadline);
  }

  private async ending(write: () => Promise<unknown>): Promise<void> {
    // The heartbeat goes on while the write is tried (and tried again), so
    // the lease cannot lapse under a slow store.
    this.closing = true;
    try {
      await write();
    } finally {
      this.stop();
    }
  }

  /**
   * The work ran but its result cannot be stored: the run ends failed
   * (terminal) with the reason, replayed to later claims and never run again.
   */
  async refused(reason: string): Promise<void> {
    this.closing = true;
    try {
      await this.transport.call("POST", "/v1/fail", { lease: this.lease, class: "terminal", message: reason });
    } catch {
      // The caller's own error says more; the claim then runs out.
    } finally {
      this.stop();
    }
  }

  private held(): LeaseJson {
    if (this.finished) throw new IdemError(`${this.scope}/${this.key}: the run has already ended`);
    return this.lease;
  }
}
