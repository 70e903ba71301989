/** The errors the client throws: one per answer a caller may branch on. */

/** Anything the idem client throws. */
export class IdemError extends Error {
  override name = "IdemError";
}

/**
 * Throw it (or a subclass) from a handler for a failure that will happen the
 * same way every time: it is stored and replayed to every later call with the
 * key, instead of being retried.
 */
export class Terminal extends Error {
  override name = "Terminal";
}

/** Another holder runs the key right now; try again after `retryAfterMs`. */
export class InProgress extends IdemError {
  override name = "InProgress";
  constructor(
    readonly scope: string,
    readonly key: string,
    readonly retryAfterMs: number,
  ) {
    super(`${scope}/${key} is being run by another holder; try again in ${retryAfterMs} ms`);
  }
}

/** The key was first used with another fingerprint (another request). */
export class Mismatch extends IdemError {
  override name = "Mismatch";
  constructor(
    readonly scope: string,
    readonly key: string,
  ) {
    super(`${scope}/${key} was first used with another fingerprint`);
  }
}

/**
 * An earlier run of the key failed for good; its failure is replayed.
 * `failureClass` is "terminal" or "unknown" (a step in doubt: see idem resolve).
 */
export class ReplayedFailure extends IdemError {
  override name = "ReplayedFailure";
  constructor(
    readonly scope: string,
    readonly key: string,
    readonly failureClass: string,
    readonly failure: string,
  ) {
    super(`${scope}/${key} failed before (${failureClass}): ${failure}`);
  }
}

/**
 * The claim is no longer held: its lease ran out and another holder took the
 * key over (or it was released). Nothing was written; stop acting on it.
 */
export class LeaseLost extends IdemError {
  override name = "LeaseLost";
}

/**
 * A step an earlier attempt started and never finished, under the "park"
 * policy: the run is failed as unknown until someone runs idem resolve.
 */
export class StepInDoubt extends IdemError {
  override name = "StepInDoubt";
  constructor(
    readonly step: string,
    readonly attempt: number,
  ) {
    super(
      `step ${JSON.stringify(step)} was started by attempt ${attempt} and never finished: ` +
        "its effect is in doubt; the record is parked for idem resolve",
    );
  }
}

/** idem serve refused a request: `status`, `kind` and `detail` say why. */
export class ApiError extends IdemError {
  override name = "ApiError";
  readonly type: string;
  readonly detail: string;
  constructor(
    readonly status: number,
    problem: { type?: string; detail?: string },
  ) {
    super(`idem serve answered ${status}: ${problem.detail ?? JSON.stringify(problem)}`);
    this.type = problem.type ?? "";
    this.detail = problem.detail ?? "";
  }
  /** The last part of the problem's type: "bad-request", "lease-lost"... */
  get kind(): string {
    return this.type.split("/").pop() ?? "";
  }
}

/** idem serve could not be reached after the client's retries; nothing ran. */
export class Unavailable extends IdemError {
  override name = "Unavailable";
}
