// Several worker processes handle every key several times over while
// workers are SIGKILLed mid-handler and started again, on each store
// (SQLite shared by the processes, Redis, idem serve); afterwards every key
// is completed once, by the holder whose fenced effect the downstream keeps,
// and every re-execution is a takeover of a killed holder's claim.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Idem } from "../idem.js";
import { eachStore, scratch } from "./stores.mjs";

const WORKERS = 4;
const KEYS = 120;
const COPIES = 2;
const KILLS = 6;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The downstream: keeps, per key, the write with the largest fence. */
async function startDownstream() {
  const kept = new Map();
  const server = createServer(async (request, response) => {
    let body = "";
    for await (const chunk of request) body += chunk;
    const { key, fence } = JSON.parse(body);
    const applied = !(kept.get(key) >= fence);
    if (applied) kept.set(key, fence);
    response.end(JSON.stringify({ applied }));
  }).listen(0, "127.0.0.1");
  await once(server, "listening");
  return { kept, server, url: `http://127.0.0.1:${server.address().port}/effect` };
}

const stores = await eachStore();
after(() => stores.stop());

for (const name of stores.names) test(`${name}: workers killed mid-handler leave every key done once`, async () => {
  const options = stores.options(name);
  const downstream = await startDownstream();
  const ledger = join(scratch(), "ledger");
  writeFileSync(ledger, "");
  const worker = fileURLToPath(new URL("./worker.mjs", import.meta.url));
  const start = (seed) => {
    const child = spawn(process.execPath, [
      worker, options.url, options.token ?? "", downstream.url, ledger, KEYS, COPIES, seed,
    ], { stdio: "inherit" });
    child.exited = once(child, "exit");
    return child;
  };
  const lastLineOf = (pid) => {
    const mine = readFileSync(ledger, "utf8").split("\n").filter((l) => l.startsWith(`${pid} `));
    return (mine.at(-1) ?? "").split(" ");
  };
  const workers = Array.from({ length: WORKERS }, (_, i) => start(i + 1));
  let kills = 0;
  let seed = 1;
  const running = (child) => child.exitCode === null && child.signalCode === null;
  try {
    const deadline = Date.now() + 60_000;
    while (kills < KILLS && Date.now() < deadline && workers.some(running)) {
      const victim = Math.floor(((seed = (seed * 48271) % 2147483647) / 2147483647) * WORKERS);
      const child = workers[victim];
      if (!running(child)) continue;
      // Kill it mid-handler: after it started a key, before it said done.
      while (Date.now() < deadline && running(child)) {
        const last = lastLineOf(child.pid);
        if (last[1] === "start" || last[1] === "effect") {
          child.kill("SIGKILL");
          await child.exited;
          kills += 1;
          break;
        }
        await sleep(2);
      }
      workers[victim] = start(100 + kills);
      await sleep(50 + (seed % 100));
    }
    for (const child of workers) {
      const [code] = await child.exited;
      assert.equal(code, 0);
    }
  } finally {
    for (const child of workers) if (running(child)) child.kill("SIGKILL");
    downstream.server.close();
  }
  assert.equal(kills, KILLS);

  const starts = new Map();
  const done = new Map();
  for (const line of readFileSync(ledger, "utf8").split("\n")) {
    const [, event, key, fence] = line.split(" ");
    const into = event === "start" ? starts : event === "done" ? done : null;
    if (into) into.set(key, [...(into.get(key) ?? []), Number(fence)]);
  }
  const idem = new Idem({ ...options, scope: "orders" });
  let reruns = 0;
  {
    for (let i = 0; i < KEYS; i++) {
      const key = `order-${i}`;
      const record = await idem.record(key);
      assert.equal(record?.state, "completed", key);
      const stored = record.fence;
      assert.deepEqual(record.response, { fence: stored }, key);
      // The downstream keeps the completing holder's effect, and no holder
      // started after the key was completed.
      assert.equal(downstream.kept.get(key), stored, key);
      const started = starts.get(key) ?? [];
      assert.ok(started.includes(stored) && Math.max(...started) === stored, `${key}: ${started}`);
      // At most one completion acknowledged, and it is the stored one.
      const acked = done.get(key) ?? [];
      assert.ok(acked.length === 0 || (acked.length === 1 && acked[0] === stored), `${key}: ${acked}`);
      reruns += started.length - 1;
    }
  }
  // Every re-execution took over a killed holder's claim: one at most per kill.
  assert.ok(reruns >= 1 && reruns <= kills, `${reruns} re-executions for ${kills} kills`);
});
