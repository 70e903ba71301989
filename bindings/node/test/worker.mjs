// One worker process of processes.test.mjs: handles its deliveries (every
// key, several times, shuffled), each through withIdempotency, with a fenced
// write to the test's downstream service as the effect. It appends what it
// does to a shared ledger, one line per event, so the test can check the
// run after workers are SIGKILLed mid-handler.
//
// Usage: node worker.mjs STORE_URL TOKEN DOWNSTREAM LEDGER KEYS COPIES SEED

import { appendFileSync } from "node:fs";

import { Idem, InProgress, LeaseLost } from "../idem.js";

const [url, token, downstream, ledger, keys, copies, seed] = process.argv.slice(2);
let state = Number(seed) * 2654435761 + 1;
const random = () => ((state = (state * 1103515245 + 12345) % 2147483648) / 2147483648);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const note = (...fields) => appendFileSync(ledger, `${[process.pid, ...fields].join(" ")}\n`);

const idem = new Idem({ url, token: token || undefined, scope: "orders", leaseMs: 1000 });
const deliveries = [];
for (let i = 0; i < Number(keys); i++) for (let c = 0; c < Number(copies); c++) deliveries.push(`order-${i}`);
for (let i = deliveries.length - 1; i > 0; i--) {
  const j = Math.floor(random() * (i + 1));
  [deliveries[i], deliveries[j]] = [deliveries[j], deliveries[i]];
}

while (deliveries.length > 0) {
  const key = deliveries.shift();
  try {
    const outcome = await idem.withIdempotency(key, async (run) => {
      note("start", key, run.fence);
      await sleep(10 + random() * 30);
      const answer = await fetch(downstream, {
        method: "POST",
        body: JSON.stringify({ key, fence: run.fence }),
      });
      const { applied } = await answer.json();
      note("effect", key, run.fence, applied ? "applied" : "stale");
      await sleep(random() * 10);
      return { fence: run.fence };
    }, { fingerprint: { order: key } });
    note(outcome.kind === "executed" ? "done" : "replayed", key, outcome.value.fence);
  } catch (error) {
    if (error instanceof InProgress) {
      // Redelivered later, as a broker would.
      deliveries.push(key);
      await sleep(Math.min(error.retryAfterMs, 50));
    } else if (error instanceof LeaseLost) {
      note("lost", key);
      deliveries.push(key);
    } else {
      throw error;
    }
  }
}
note("finished");
