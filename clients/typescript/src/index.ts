/**
 * Exactly-once effects over at-least-once delivery, from TypeScript: the
 * client of idem serve.
 *
 * ```ts
 * const idem = new Idem({ url: "http://127.0.0.1:8700", token, scope: "charges" });
 * const outcome = await idem.withIdempotency(order.id, () => charge(order));
 * ```
 */

export { Idem, fingerprintOf } from "./client.js";
export type { CallOptions, Executed, IdemOptions, Outcome, Replayed } from "./client.js";
export {
  ApiError,
  IdemError,
  InProgress,
  LeaseLost,
  Mismatch,
  ReplayedFailure,
  StepInDoubt,
  Terminal,
  Unavailable,
} from "./errors.js";
export { Run } from "./run.js";
export type { FailureClass, LeaseJson, StepPolicy } from "./run.js";
