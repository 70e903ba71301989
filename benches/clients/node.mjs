// idem's Node package (the engine in-process) beside @node-idempotency/core
// with its Redis adapter, both on one Redis, in one run, with ioredis doing
// the raw work (SET NX, then SET) as the anchor. Run by
// `scripts/bench-clients`, which starts the Redis server and installs the
// packages into a scratch folder.
//
// Each round calls, one library after the other, for SECONDS each:
// - unique keys: every call runs the function (claim, run, complete);
// - replays: every call asks again for one of 1,000 keys completed before;
// at 1 caller and at 8 concurrent callers (Promises on the one event loop).
// Prints one line per measurement, as benches/clients/python.py does:
// `<case> <callers> <library> <ops/s> <p50 µs> <p99 µs> <CPU µs/op>`
// (CPU: the whole process, the engine's threads included).
//
// Usage: node node.mjs REDIS_PORT SECONDS ROUNDS

import { randomUUID } from "node:crypto";

import { Idempotency } from "@node-idempotency/core";
import { RedisStorageAdapter } from "@node-idempotency/storage-adapter-redis";
import { Idem } from "idem-engine";
import Redis from "ioredis";

const [port, seconds, rounds] = [Number(process.argv[2]), Number(process.argv[3]), Number(process.argv[4])];
const REPLAY_KEYS = 1000;
const RESULT = { ok: true, charge: "ch_1" };

async function idem() {
  const engine = new Idem({ url: `redis://127.0.0.1:${port}/0?namespace=bench-idem-${randomUUID()}`, scope: "charges" });
  return (key) => engine.withIdempotency(key, () => RESULT);
}

async function peer() {
  const storage = new RedisStorageAdapter({ url: `redis://127.0.0.1:${port}` });
  await storage.connect();
  const idempotency = new Idempotency(storage, { keyHeader: "idempotency-key" });
  const prefix = randomUUID();
  return async (key) => {
    const request = {
      method: "POST",
      headers: { "idempotency-key": `${prefix}-${key}` },
      body: { order_id: key },
      path: "/charges",
    };
    const seen = await idempotency.onRequest(request);
    if (seen) return seen.body;
    await idempotency.onResponse(request, { body: RESULT, additional: { status: 200 } });
    return RESULT;
  };
}

async function raw() {
  const redis = new Redis({ port, host: "127.0.0.1" });
  const prefix = `raw:${randomUUID()}:`;
  const result = JSON.stringify(RESULT);
  // What the store itself must do per call, as python.py's anchor: claim
  // with SET NX and a lease, then store the result (a replay: the SET NX
  // that fails, then one GET).
  return async (key) => {
    const id = prefix + key;
    if ((await redis.set(id, "in_progress", "PX", 30_000, "NX")) === "OK") {
      await redis.set(id, result, "PX", 3_600_000);
      return RESULT;
    }
    return JSON.parse(await redis.get(id));
  };
}

async function measure(call, keys, callers) {
  const latencies = [];
  const end = performance.now() + seconds * 1000;
  const cpu = process.cpuUsage();
  let calls = 0;
  const caller = async () => {
    while (performance.now() < end) {
      const key = keys();
      const started = performance.now();
      await call(key);
      latencies.push((performance.now() - started) * 1000);
      calls += 1;
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: callers }, caller));
  const elapsed = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  latencies.sort((a, b) => a - b);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
  return [calls / elapsed, at(0.5), at(0.99), (used.user + used.system) / calls];
}

const libraries = { idem: await idem(), node_idempotency: await peer(), ioredis_raw: await raw() };
for (const call of Object.values(libraries)) {
  for (let i = 0; i < REPLAY_KEYS; i += 1) await call(`replay-${i}`);
}
for (let round = 0; round < rounds; round += 1) {
  for (const callers of [1, 8]) {
    for (const [name, call] of Object.entries(libraries)) {
      const unique = await measure(call, () => randomUUID(), callers);
      console.log(["unique", callers, name, ...unique.map((v) => v.toFixed(1))].join(" "));
      let i = 0;
      const replays = await measure(call, () => `replay-${(i++ * 7919) % REPLAY_KEYS}`, callers);
      console.log(["replay", callers, name, ...replays.map((v) => v.toFixed(1))].join(" "));
    }
  }
}
process.exit(0);
