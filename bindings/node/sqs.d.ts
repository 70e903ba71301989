/**
 * Exactly-once handlers for Amazon SQS consumers with the AWS SDK v3.
 *
 * ```ts
 * import { SQSClient } from "@aws-sdk/client-sqs";
 * import { Idem } from "idem-engine";
 * import { SqsConsumer } from "idem-engine/sqs";
 *
 * const consumer = new SqsConsumer(new Idem({ url: "sqlite:idem.db" }), { client: new SQSClient({}), queueUrl });
 * await consumer.run(async (message, run) => ship(JSON.parse(message.Body), run.fence), { signal });
 * ```
 */

import type { Idem, RunContext } from "./idem";

/** What the consumer layer decided for a message, and was done on the queue. */
export interface Settlement {
  action: "ack" | "retry" | "dead_letter";
  /** For a retry, the delay before the next delivery, ms. */
  afterMs?: number | null;
  /** Why (a retry's cause, a dead-letter's reason). */
  reason?: string | null;
  /** For an ack, whether the message was a duplicate of a completed one. */
  replayed: boolean;
  /** The message's key, when one could be read. */
  key?: string | null;
  /** The attributes of a dead-letter copy, names and values alternating. */
  deadLetterHeaders: string[];
}

export interface SqsConsumerOptions {
  /** Your SQSClient. */
  client: any;
  queueUrl: string;
  /** [default: `<queue>-dead`, created by `connect`]. */
  deadLetterQueueUrl?: string;
  /** The keys' scope [default: the queue's name]. */
  scope?: string;
  /** Key sources in order: "header:NAME", "message_id", "/jsonPointer", "fields:/a,/b" (a hash of those fields), "composite:/a,/b", "content_hash" [default: the Idempotency-Key attribute, then the MessageId]. */
  keys?: string[];
  /** Whether a key reused with another body is dead-lettered [default: true]. */
  fingerprint?: boolean;
  /** The shortest delay before a retried delivery, ms [default: 100]. */
  minRetryDelayMs?: number;
  /** The longest delay before a retried delivery, ms [default: 300000]. */
  maxRetryDelayMs?: number;
  /** The queue's visibility timeout, s, extended while a handler runs [default: 30]. */
  visibilityTimeoutS?: number;
}

export type SqsHandler<T> = (message: any, run: RunContext) => T | Promise<T>;

export class SqsConsumer {
  constructor(idem: Idem, options: SqsConsumerOptions);
  /** Finds (or creates) the dead-letter queue. */
  connect(): Promise<this>;
  /** Runs one received message through idem and settles it on the queue. */
  handle<T>(message: any, handler: SqsHandler<T>): Promise<Settlement>;
  /** Receives and handles messages until `signal` is aborted. */
  run<T>(handler: SqsHandler<T>, options?: { signal?: AbortSignal; maxMessages?: number; waitTimeSeconds?: number }): Promise<void>;
}
