// Exactly-once handlers for Amazon SQS consumers with the AWS SDK v3: every
// message runs through idem's consumer layer (the Rust idem-consumer code,
// not a copy), which reads its key, runs the handler once per key and
// decides what happens to the message; this adapter carries that out as the
// Rust idem-sqs crate does:
//
// | the consumer layer decides | on the queue |
// |---|---|
// | ack | DeleteMessage |
// | retry after d | ChangeMessageVisibility to d: SQS delivers it again after d |
// | dead-letter | a copy to the dead-letter queue with attributes Idem-Reason, Idem-Key, Idem-Consumer and Idem-Source-Message-Id; once SQS accepted it, DeleteMessage |
//
// While a handler runs, the message's visibility is extended every third of
// `visibilityTimeoutS` as long as its claim is held, so a long handler is
// not delivered to another worker; once the claim is lost the extensions
// stop. A dead-letter copy SQS does not accept leaves the original to come
// back after the longest retry delay: it is never lost.

"use strict";

const {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
} = require("@aws-sdk/client-sqs");

const native = require("./native.js");
const { RunContext } = require("./idem.js");
const { call, encoded, failureOf, sync } = require("./errors.js");

/** The longest visibility SQS allows, s. */
const MAX_VISIBILITY_S = 43_200;

/** What SQS calls the attributes a key may come from, besides message attributes. */
const SYSTEM_KEYS = ["MessageDeduplicationId", "MessageGroupId", "SenderId"];

function attributesOf(message) {
  const lines = [];
  for (const [name, value] of Object.entries(message.MessageAttributes ?? {})) {
    if (value.StringValue !== undefined) lines.push(name, value.StringValue);
  }
  for (const name of SYSTEM_KEYS) {
    const value = message.Attributes?.[name];
    if (value !== undefined) lines.push(name, value);
  }
  return lines;
}

/**
 * Runs the messages of `queueUrl` through idem. `client` is your
 * `SQSClient`. Options: `scope` (default: the queue's name), `keys` (where
 * keys come from, in order: "header:NAME" for a message attribute or
 * MessageDeduplicationId/MessageGroupId, "message_id", a JSON pointer
 * "/orderId", "content_hash"; default: the `Idempotency-Key` attribute,
 * then the MessageId), `fingerprint` (default true), `deadLetterQueueUrl`
 * (default `<queue>-dead`, created by `connect`), `maxRetryDelayMs` (default
 * 300000), `visibilityTimeoutS` (the queue's, default 30).
 */
class SqsConsumer {
  constructor(idem, options) {
    const { client, queueUrl, deadLetterQueueUrl, scope, keys, fingerprint } = options;
    this.client = client;
    this.queueUrl = queueUrl;
    this.queueName = queueUrl.split("/").pop();
    this.deadLetterQueueUrl = deadLetterQueueUrl;
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 300_000;
    this.visibilityTimeoutS = options.visibilityTimeoutS ?? 30;
    this.guard = sync(
      () =>
        new native.ConsumerGuard(idem.engine, {
          scope: scope ?? this.queueName,
          keys,
          fingerprint,
          name: this.queueName,
          minRetryDelayMs: options.minRetryDelayMs,
          maxRetryDelayMs: this.maxRetryDelayMs,
        }),
    );
  }

  /** Finds (or creates) the dead-letter queue, `<queue>-dead` unless given. */
  async connect() {
    if (this.deadLetterQueueUrl === undefined) {
      const created = await this.client.send(new CreateQueueCommand({ QueueName: `${this.queueName}-dead` }));
      this.deadLetterQueueUrl = created.QueueUrl;
    }
    return this;
  }

  /** Runs one received message through idem and settles it on the queue. */
  async handle(message, handler) {
    const begun = await call(() =>
      this.guard.begin({
        payload: Buffer.from(message.Body ?? "", "utf8"),
        headers: attributesOf(message),
        messageId: message.MessageId,
        deliveryCount: Number(message.Attributes?.ApproximateReceiveCount) || undefined,
      }),
    );
    let settlement = begun;
    if (typeof begun.complete === "function") {
      const run = new RunContext(`${this.queueName}/${begun.key}`, begun.context);
      const extend = setInterval(() => {
        if (run.leaseLost) return;
        this.visibility(message, this.visibilityTimeoutS).catch(() => {});
      }, (this.visibilityTimeoutS * 1000) / 3);
      extend.unref();
      try {
        const value = await handler(message, run);
        settlement = await call(() => begun.complete(...encoded(value)));
      } catch (error) {
        settlement = await call(() => begun.fail(...failureOf(error)));
      } finally {
        clearInterval(extend);
        run.unwatch();
      }
    }
    await this.settle(message, settlement);
    return settlement;
  }

  async settle(message, settlement) {
    if (settlement.action === "ack") {
      await this.client.send(new DeleteMessageCommand({ QueueUrl: this.queueUrl, ReceiptHandle: message.ReceiptHandle }));
    } else if (settlement.action === "retry") {
      await this.visibility(message, Math.ceil((settlement.afterMs ?? 0) / 1000));
    } else {
      try {
        await this.deadLetter(message, settlement);
      } catch {
        // Not accepted: the original comes back later, never lost.
        await this.visibility(message, Math.ceil(this.maxRetryDelayMs / 1000));
        return;
      }
      await this.client.send(new DeleteMessageCommand({ QueueUrl: this.queueUrl, ReceiptHandle: message.ReceiptHandle }));
    }
  }

  visibility(message, seconds) {
    return this.client.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: this.queueUrl,
        ReceiptHandle: message.ReceiptHandle,
        VisibilityTimeout: Math.min(Math.max(seconds, 0), MAX_VISIBILITY_S),
      }),
    );
  }

  async deadLetter(message, settlement) {
    if (this.deadLetterQueueUrl === undefined) await this.connect();
    const attributes = { ...(message.MessageAttributes ?? {}) };
    const lines = [...settlement.deadLetterHeaders, "Idem-Source-Message-Id", message.MessageId];
    for (let i = 0; i + 1 < lines.length; i += 2) {
      attributes[lines[i]] = { DataType: "String", StringValue: lines[i + 1] };
    }
    const fifo = this.deadLetterQueueUrl.endsWith(".fifo");
    await this.client.send(
      new SendMessageCommand({
        QueueUrl: this.deadLetterQueueUrl,
        MessageBody: message.Body,
        MessageAttributes: attributes,
        ...(fifo
          ? { MessageGroupId: message.Attributes?.MessageGroupId ?? "idem-dead", MessageDeduplicationId: message.MessageId }
          : {}),
      }),
    );
  }

  /**
   * Receives and handles messages until `signal` is aborted: up to
   * `maxMessages` at once, each through `handle`.
   */
  async run(handler, { signal, maxMessages = 10, waitTimeSeconds = 1 } = {}) {
    await this.connect();
    while (!signal?.aborted) {
      const received = await this.client.send(
        new ReceiveMessageCommand({
          QueueUrl: this.queueUrl,
          MaxNumberOfMessages: maxMessages,
          WaitTimeSeconds: waitTimeSeconds,
          MessageAttributeNames: ["All"],
          MessageSystemAttributeNames: ["All"],
        }),
        { abortSignal: signal },
      ).catch((error) => {
        if (signal?.aborted) return { Messages: [] };
        throw error;
      });
      await Promise.all((received.Messages ?? []).map((message) => this.handle(message, handler)));
    }
  }
}

module.exports = { SqsConsumer };
