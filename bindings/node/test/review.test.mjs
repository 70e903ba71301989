// The review's scenario where the TypeScript client gave finished work up:
// idem serve restarted while `complete` is pending. The engine retries for
// the lease; the run completes and the next claim replays.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Idem } from "../idem.js";
import { TOKEN, sleep, startServe } from "./stores.mjs";

test("a completion pending while idem serve restarts lands and is replayed", async () => {
  const serve = await startServe();
  try {
    const idem = new Idem({ url: serve.url, token: TOKEN, scope: "charges", leaseMs: 10_000 });
    const run = await idem.claim("order-1");
    await serve.kill();
    let done = false;
    const completing = run.complete({ charged: 1 }).then(() => {
      done = true;
    });
    await sleep(2000);
    assert.equal(done, false, "complete returned while idem serve was down");
    await serve.start();
    await completing;
    assert.deepEqual(await idem.withIdempotency("order-1", () => "again"), {
      kind: "replayed",
      value: { charged: 1 },
    });
    assert.equal((await idem.record("order-1")).attempt, 1);
  } finally {
    await serve.kill();
  }
});
