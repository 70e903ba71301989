// The package's errors, and the engine's errors translated into them.

"use strict";

/** Anything idem throws. */
class IdemError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}

/**
 * Throw it (or a subclass) from a handler for a failure that will happen the
 * same way every time: it is stored and replayed to every later call with the
 * key, instead of being retried.
 */
class Terminal extends Error {
  constructor(message) {
    super(message);
    this.name = "Terminal";
  }
}

/** A value idem was given breaks a rule (URL, key, setting, JSON). */
class InvalidInput extends IdemError {}
/** The store could not be opened, or did not answer for a whole lease. */
class Unavailable extends IdemError {}
/** Another holder runs the key right now; try again after `retryAfterMs`. */
class InProgress extends IdemError {
  constructor(message, retryAfterMs) {
    super(message);
    this.retryAfterMs = retryAfterMs;
  }
}
/** The key was first used with another fingerprint (another request). */
class Mismatch extends IdemError {}
/** The key ran before and its record expired; the store remembers it: refused, not run again. */
class KeyExpired extends IdemError {
  constructor(message, ageMs) {
    super(message);
    this.ageMs = ageMs;
  }
}
/** An earlier run of the key failed for good; its failure is replayed. */
class ReplayedFailure extends IdemError {
  constructor(message, failureClass, failure) {
    super(message);
    this.failureClass = failureClass;
    this.failure = failure;
  }
}
/** The claim is no longer held; nothing was written: stop acting on it. */
class LeaseLost extends IdemError {}
/** The result is over the store's limit; the key is recorded as failed. */
class ResultTooLarge extends IdemError {}
/** A step in doubt under the "park" policy: the run ends failed, unknown. */
class StepInDoubt extends IdemError {
  constructor(message, step, attempt) {
    super(message);
    this.step = step;
    this.attempt = attempt;
  }
}
/** A step misused: its name is invalid or already used in this run. */
class InvalidStep extends IdemError {}

/** The engine's error as the package's own class. */
function translated(error) {
  let info;
  try {
    info = JSON.parse(error.message);
  } catch {
    return error;
  }
  switch (info.kind) {
    case "InProgress":
      return new InProgress(info.message, info.retryAfterMs);
    case "ReplayedFailure":
      return new ReplayedFailure(info.message, info.failureClass, info.failure);
    case "StepInDoubt":
      return new StepInDoubt(info.message, info.step, info.attempt);
    case "InvalidInput":
      return new InvalidInput(info.message);
    case "Unavailable":
      return new Unavailable(info.message);
    case "Mismatch":
      return new Mismatch(info.message);
    case "KeyExpired":
      return new KeyExpired(info.message, info.ageMs);
    case "LeaseLost":
      return new LeaseLost(info.message);
    case "ResultTooLarge":
      return new ResultTooLarge(info.message);
    case "InvalidStep":
      return new InvalidStep(info.message);
    default:
      return new IdemError(info.message);
  }
}

async function call(work) {
  try {
    return await work();
  } catch (error) {
    throw translated(error);
  }
}

function sync(work) {
  try {
    return work();
  } catch (error) {
    throw translated(error);
  }
}

/** `value` as JSON, or why it is not: `[json, undefined]` or `[undefined, reason]`. */
function encoded(value) {
  try {
    return [JSON.stringify(value === undefined ? null : value), undefined];
  } catch (error) {
    return [undefined, String(error)];
  }
}

/** A handler's error as the engine records it: `[message, class]`, terminal for `Terminal`. */
function failureOf(error) {
  if (error instanceof Terminal) return [error.message || error.name, "terminal"];
  return [error instanceof Error ? `${error.name}: ${error.message}` : String(error), "retryable"];
}

module.exports = {
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
};
