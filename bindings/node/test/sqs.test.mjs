// The SQS consumer with the AWS SDK v3 against moto's SQS (a moto_server
// child process), on SQLite and Redis: duplicates run once and are
// deleted (those that meet their key in progress come back and replay), a retryable failure comes back after its visibility delay and
// runs again, a terminal failure and a keyless message go to the
// dead-letter queue with idem's attributes, and two consumers on one queue
// run each key once.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  CreateQueueCommand, GetQueueAttributesCommand, ReceiveMessageCommand, SQSClient, SendMessageCommand,
} from "@aws-sdk/client-sqs";

import { Idem, Terminal } from "../idem.js";
import { SqsConsumer } from "../sqs.js";
import { freePort, scratch, sleep, startRedis } from "./stores.mjs";

function motoServer() {
  const given = process.env.IDEM_MOTO_SERVER;
  const cached = join(homedir(), ".cache/idem/tools/moto/bin/moto_server");
  if (given) return given;
  if (existsSync(cached)) return cached;
  throw new Error("moto_server not found: set IDEM_MOTO_SERVER (scripts/test installs moto)");
}

let moto;
let client;
let motoUrl;
const folder = scratch();
const redis = await startRedis();
before(async () => {
  const port = await freePort();
  moto = spawn(motoServer(), ["-H", "127.0.0.1", "-p", String(port)], { stdio: "ignore" });
  motoUrl = `http://127.0.0.1:${port}`;
  client = new SQSClient({
    endpoint: `http://127.0.0.1:${port}`,
    region: "us-east-1",
    credentials: { accessKeyId: "testing", secretAccessKey: "testing" },
  });
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await client.send(new CreateQueueCommand({ QueueName: "probe" }));
      return;
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await sleep(100);
    }
  }
});
after(async () => {
  client?.destroy();
  if (moto && moto.exitCode === null) {
    moto.kill("SIGKILL");
    await once(moto, "exit");
  }
  await redis.stop();
});

let queues = 0;
const open = (store) =>
  new Idem({
    url: store === "sqlite" ? `sqlite:${join(folder, `idem-${++queues}.db`)}` : `${redis.url}/0?namespace=sqs${++queues}`,
  });

async function queue(name) {
  const created = await client.send(new CreateQueueCommand({ QueueName: `${name}-${++queues}` }));
  return created.QueueUrl;
}

function send(queueUrl, body, key) {
  return client.send(
    new SendMessageCommand({
      QueueUrl: queueUrl,
      MessageBody: JSON.stringify(body),
      MessageAttributes: key === undefined ? undefined : { "Idempotency-Key": { DataType: "String", StringValue: key } },
    }),
  );
}

/** `consumer`, with each settlement it carries out pushed to `settled`. */
function recording(consumer, settled) {
  return Object.assign(Object.create(consumer), {
    async settle(message, settlement) {
      settled.push(settlement);
      return consumer.settle(message, settlement);
    },
  });
}

/** Runs `consumers` until `done()` says so, or 20 s. */
async function runUntil(consumers, handler, done) {
  const stop = new AbortController();
  const running = consumers.map((c) => c.run(handler, { signal: stop.signal, waitTimeSeconds: 0 }));
  const deadline = Date.now() + 20_000;
  while (!done() && Date.now() < deadline) await sleep(50);
  stop.abort();
  await Promise.all(running);
}

async function waiting(queueUrl) {
  const { Attributes } = await client.send(
    new GetQueueAttributesCommand({
      QueueUrl: queueUrl,
      AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    }),
  );
  return Number(Attributes.ApproximateNumberOfMessages) + Number(Attributes.ApproximateNumberOfMessagesNotVisible);
}

for (const store of ["sqlite", "redis"]) {
  describe(`sqs on ${store}`, () => {
    test("duplicates run once and every copy is deleted", async () => {
      const queueUrl = await queue("dup");
      // A duplicate in progress elsewhere is retried after that claim's
      // lease at most: here a second.
      const consumer = new SqsConsumer(open(store), { client, queueUrl, maxRetryDelayMs: 1000 });
      const runs = [];
      const settled = [];
      for (let i = 0; i < 3; i += 1) await send(queueUrl, { order: 7 }, "order-7");
      await send(queueUrl, { order: 8 }, "order-8");
      const handler = (message, run) => {
        assert.equal(typeof run.fence, "number");
        runs.push(JSON.parse(message.Body).order);
        return { shipped: true };
      };
      // One receive takes all four and handles them at once: a duplicate
      // that meets its key in progress comes back a second later.
      const acks = () => settled.filter((s) => s.action === "ack");
      await runUntil([recording(consumer, settled)], handler, () => acks().length === 4);
      assert.deepEqual(runs.sort(), [7, 8]);
      assert.equal(acks().length, 4);
      assert.equal(acks().filter((s) => s.replayed).length, 2);
      assert.ok(settled.every((s) => s.action === "ack" || /in progress/.test(s.reason)));
      assert.equal(await waiting(queueUrl), 0);
    });

    test("two consumers on one queue run each key once", async () => {
      const queueUrl = await queue("pair");
      const idem = open(store);
      const options = { client, queueUrl, minRetryDelayMs: 1000, maxRetryDelayMs: 1000 };
      const settled = [];
      const consumers = [new SqsConsumer(idem, options), new SqsConsumer(idem, options)].map((c) =>
        recording(c, settled),
      );
      for (let order = 0; order < 10; order += 1) {
        await send(queueUrl, { order }, `o-${order}`);
        await send(queueUrl, { order }, `o-${order}`);
      }
      const runs = [];
      const handler = async (message) => {
        runs.push(JSON.parse(message.Body).order);
        await sleep(200);
        return "shipped";
      };
      const acks = () => settled.filter((s) => s.action === "ack");
      await runUntil(consumers, handler, () => acks().length === 20);
      assert.deepEqual(runs.sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
      assert.equal(acks().length, 20);
      assert.equal(acks().filter((s) => !s.replayed).length, 10);
      assert.ok(settled.every((s) => s.action === "ack" || s.action === "retry"));
      assert.equal(await waiting(queueUrl), 0);
    });
  });
}

test("a retryable failure comes back after its delay and runs again", async () => {
  const queueUrl = await queue("retry");
  const consumer = new SqsConsumer(open("sqlite"), { client, queueUrl, minRetryDelayMs: 1000, maxRetryDelayMs: 1000 });
  const attempts = [];
  const handler = (message, run) => {
    attempts.push(run.attempt);
    if (attempts.length === 1) throw new Error("the warehouse is away");
    return "shipped";
  };
  await send(queueUrl, { order: 1 }, "o-1");
  await runUntil([consumer], handler, () => attempts.length === 2);
  await sleep(300);
  assert.deepEqual(attempts, [1, 2]);
  assert.equal(await waiting(queueUrl), 0);
});

test("terminal failures and keyless messages are dead-lettered with idem's attributes", async () => {
  const queueUrl = await queue("dead");
  const consumer = await new SqsConsumer(open("sqlite"), { client, queueUrl, keys: ["header:Idempotency-Key"] }).connect();
  let runs = 0;
  const handler = () => {
    runs += 1;
    throw new Terminal("order 9 does not exist");
  };
  await send(queueUrl, { order: 9 }, "o-9");
  await send(queueUrl, { order: 10 });
  const letters = [];
  const stop = new AbortController();
  const running = consumer.run(handler, { signal: stop.signal, waitTimeSeconds: 0 });
  const deadline = Date.now() + 20_000;
  while (letters.length < 2 && Date.now() < deadline) {
    const got = await client.send(
      new ReceiveMessageCommand({ QueueUrl: consumer.deadLetterQueueUrl, MaxNumberOfMessages: 10, MessageAttributeNames: ["All"] }),
    );
    letters.push(...(got.Messages ?? []));
  }
  stop.abort();
  await running;
  assert.equal(runs, 1);
  const byOrder = Object.fromEntries(letters.map((l) => [JSON.parse(l.Body).order, l.MessageAttributes]));
  assert.match(byOrder[9]["Idem-Reason"].StringValue, /order 9 does not exist/);
  assert.equal(byOrder[9]["Idem-Key"].StringValue, "o-9");
  assert.equal(byOrder[9]["Idem-Consumer"].StringValue, queueUrl.split("/").pop());
  assert.ok(byOrder[9]["Idem-Source-Message-Id"].StringValue);
  assert.match(byOrder[10]["Idem-Reason"].StringValue, /no idempotency key/);
  assert.equal(byOrder[10]["Idem-Key"], undefined);
  assert.equal(await waiting(queueUrl), 0);
});

test("a handler's sends reach SQS after its completion, once per key, none for a failed run", async () => {
  const queueUrl = await queue("emit");
  const out = await queue("emitted");
  // The engine's SQS sender takes its credentials from the environment.
  process.env.AWS_ACCESS_KEY_ID = "testing";
  process.env.AWS_SECRET_ACCESS_KEY = "testing";
  const idem = new Idem({
    url: `sqlite:${join(folder, `idem-${++queues}.db`)}`,
    outbox: `sqs://?endpoint=${encodeURIComponent(motoUrl)}&region=us-east-1`,
  });
  const consumer = new SqsConsumer(idem, { client, queueUrl, maxRetryDelayMs: 1000 });
  const ids = {};
  const settled = [];
  for (let i = 0; i < 3; i += 1) await send(queueUrl, { order: 7 }, "order-7");
  await send(queueUrl, { order: 8 }, "order-8");
  await send(queueUrl, { order: 9 }, "order-9");
  const handler = (message, run) => {
    const { order } = JSON.parse(message.Body);
    ids[order] = run.send(out, { shipped: order }, { source: "node" });
    if (order === 9) throw new Terminal("order 9 does not exist");
    return { shipped: order };
  };
  await runUntil([recording(consumer, settled)], handler, () => settled.length >= 5);
  const receive = async () => {
    const { Messages = [] } = await client.send(
      new ReceiveMessageCommand({
        QueueUrl: out, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: ["All"],
      }),
    );
    return Messages;
  };
  const received = [];
  const deadline = Date.now() + 10_000;
  while (received.length < 2 && Date.now() < deadline) received.push(...(await receive()));
  // Anything more (a second send of a key, the failed run's) would be here by now.
  received.push(...(await receive()));
  const bodies = received.map((m) => JSON.parse(m.Body)).sort((a, b) => a.shipped - b.shipped);
  assert.deepEqual(bodies, [{ shipped: 7 }, { shipped: 8 }]);
  for (const m of received) {
    const order = JSON.parse(m.Body).shipped;
    assert.equal(m.MessageAttributes["Idempotency-Key"].StringValue, ids[order]);
    assert.equal(m.MessageAttributes.source.StringValue, "node");
  }

  const plain = new Idem({ url: `sqlite:${join(folder, `idem-${++queues}.db`)}` });
  const run = await plain.claim("no-outbox");
  assert.throws(() => run.send("somewhere", "x"), (e) => e.name === "InvalidInput" && /outbox/.test(e.message));
  await run.release();
  assert.throws(() => new Idem({ url: "memory:", outbox: "smtp://mail" }), (e) => e.name === "InvalidInput");
});
