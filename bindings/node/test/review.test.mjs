// The review's scenarios where the TypeScript client leaked: idem serve
// restarted while `complete` is pending (the engine retries for the lease;
// the run completes and the next claim replays), and slow lease extensions
// of five runs beside a healthy one (each run's heartbeat is its own: the
// healthy one is never taken over).

import assert from "node:assert/strict";
import { once } from "node:events";
import { connect, createServer } from "node:net";
import { test } from "node:test";

import { Idem, InProgress, LeaseLost } from "../idem.js";
import { TOKEN, sleep, startServe } from "./stores.mjs";

/**
 * A TCP proxy in front of idem serve that holds every `/v1/extend` of a
 * key starting `slow-` for `delayMs`; other requests pass at once, in order.
 */
async function slowExtends(targetPort, delayMs) {
  const sockets = new Set();
  const server = createServer((client) => {
    const upstream = connect(targetPort, "127.0.0.1");
    sockets.add(client).add(upstream);
    upstream.on("data", (chunk) => client.write(chunk));
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
    let buffered = Buffer.alloc(0);
    let sending = Promise.resolve();
    client.on("data", (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      for (;;) {
        const end = buffered.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buffered.subarray(0, end).toString("latin1");
        const length = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
        if (buffered.length < end + 4 + length) return;
        const request = buffered.subarray(0, end + 4 + length);
        buffered = buffered.subarray(end + 4 + length);
        const slow = head.includes("/v1/extend") && request.includes('"key":"slow-');
        sending = sending.then(async () => {
          if (slow) await sleep(delayMs);
          if (!upstream.destroyed) upstream.write(request);
        });
      }
    });
    client.on("close", () => upstream.destroy());
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    port: server.address().port,
    close() {
      for (const socket of sockets) socket.destroy();
      server.close();
    },
  };
}

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

test("slow extends of five runs do not starve a healthy one", async () => {
  const serve = await startServe();
  const proxy = await slowExtends(Number(new URL(serve.url).port), 3000);
  try {
    const idem = new Idem({ url: `http://127.0.0.1:${proxy.port}`, token: TOKEN, scope: "mixed", leaseMs: 1200 });
    const other = new Idem({ url: serve.url, token: TOKEN, scope: "mixed", leaseMs: 1200 });
    const slow = await Promise.all([0, 1, 2, 3, 4].map((i) => idem.claim(`slow-${i}`)));
    const run = await idem.claim("healthy");
    // Watched from while it was live, and asked for only once lost.
    const watched = slow[0].signal;
    assert.equal(watched.aborted, false);
    for (let i = 0; i < 6; i += 1) {
      await sleep(500);
      await assert.rejects(other.claim("healthy"), InProgress);
      assert.equal(run.leaseLost, false);
    }
    await run.complete("healthy");
    assert.equal((await other.record("healthy")).attempt, 1);
    // The slow ones were slow: no extension came back within a lease.
    assert.ok(slow.every((s) => s.leaseLost));
    assert.ok(watched.reason instanceof LeaseLost, String(watched.reason));
    assert.ok(slow[1].signal.aborted && slow[1].signal.reason instanceof LeaseLost);
    assert.equal(run.signal.aborted, false);
    for (const s of slow) s.unwatch();
  } finally {
    proxy.close();
    await serve.kill();
  }
});
