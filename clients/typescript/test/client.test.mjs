// The client against a real idem serve: runs once, replays, fingerprints,
// failures by class, concurrency, heartbeats, fencing after a stall, steps
// resumed across attempts, tenants, and bad input.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  ApiError, Idem, IdemError, InProgress, LeaseLost, Mismatch, ReplayedFailure, Terminal, fingerprintOf,
} from "../dist/index.js";
import { BILLING, SHOP, startServer } from "./server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a call runs once per key and later calls replay its result", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "charges" });
  let runs = 0;
  const charge = (run) => {
    runs += 1;
    return { charge: "ch_1", fence: run.fence };
  };
  const first = await idem.withIdempotency("order-1", charge);
  assert.equal(first.kind, "executed");
  assert.equal(first.attempt, 1);
  const again = await idem.withIdempotency("order-1", charge);
  assert.deepEqual(again, { kind: "replayed", value: first.value });
  assert.equal(runs, 1);
  const record = await idem.record("order-1");
  assert.equal(record.state, "completed");
  assert.equal(record.fence, first.fence);
});

test("a key used with another payload is a mismatch", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "orders" });
  await idem.withIdempotency("a", () => 1, { fingerprint: { id: "a", qty: 1 } });
  const same = await idem.withIdempotency("a", () => 1, { fingerprint: { qty: 1, id: "a" } });
  assert.equal(same.kind, "replayed");
  await assert.rejects(idem.withIdempotency("a", () => 2, { fingerprint: { id: "a", qty: 2 } }), Mismatch);
  assert.equal(fingerprintOf({ b: 1, a: [1, "é"] }), fingerprintOf({ a: [1, "é"], b: 1 }));
});

test("terminal failures are replayed and others run again", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "mail" });
  const attempts = [];
  const send = (to) => (run) => {
    attempts.push(run.attempt);
    if (to === "nobody") throw new Terminal("no such mailbox");
    if (attempts.length === 1) throw new Error("smtp down");
    return "sent";
  };
  await assert.rejects(idem.withIdempotency("ann", send("ann")), /smtp down/);
  assert.equal((await idem.withIdempotency("ann", send("ann"))).value, "sent");
  assert.deepEqual(attempts, [1, 2]);
  await assert.rejects(idem.withIdempotency("nobody", send("nobody")), Terminal);
  const replay = await idem.withIdempotency("nobody", send("nobody")).catch((e) => e);
  assert.ok(replay instanceof ReplayedFailure);
  assert.equal(replay.failureClass, "terminal");
  assert.equal(replay.failure, "no such mailbox");
  assert.deepEqual(attempts, [1, 2, 1]);
});

test("concurrent calls of one key run it once and share its result", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "race" });
  for (let round = 0; round < 5; round++) {
    let runs = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 16 }, () =>
        idem.withIdempotency(`k-${round}`, async () => {
          runs += 1;
          await sleep(100);
          return `done ${round}`;
        }, { waitMs: 10_000 }),
      ),
    );
    assert.equal(runs, 1);
    assert.equal(outcomes.filter((o) => o.kind === "executed").length, 1);
    assert.deepEqual(new Set(outcomes.map((o) => o.value)), new Set([`done ${round}`]));
  }
});

test("the heartbeat keeps a long run held past its lease", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "long", leaseMs: 600 });
  const outcome = await idem.withIdempotency("k", async (run) => {
    for (let i = 0; i < 8; i++) {
      await sleep(300);
      await assert.rejects(idem.withIdempotency("k", () => "twice"), InProgress);
    }
    assert.equal(run.signal.aborted, false);
    return "finished";
  });
  assert.equal(outcome.value, "finished");
  assert.equal((await idem.record("k", "long")).attempt, 1);
});

test("a stalled holder is fenced out by the takeover", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "stall", leaseMs: 300 });
  let taker;
  const stalled = idem.withIdempotency("k", async (run) => {
    run.stop(); // the process stalls: no more heartbeats
    await sleep(600);
    taker = await idem.withIdempotency("k", (other) => {
      assert.ok(other.takeover && other.attempt === 2 && other.fence > run.fence);
      return { by: "taker" };
    });
    return { by: "stalled" };
  });
  await assert.rejects(stalled, IdemError);
  assert.equal(taker.kind, "executed");
  assert.deepEqual((await idem.record("k", "stall")).response, { by: "taker" });
});

test("a lost lease aborts the run's signal", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "lost", leaseMs: 300 });
  const outcome = idem.withIdempotency("k", async (run) => {
    // An operator force-releases the key (idem release) while it runs.
    const released = spawnSync(process.env.IDEM_BIN, [
      "--store", `sqlite:${join(server.folder, "idem.db")}`, "release", "shop/lost", "k",
    ]);
    assert.equal(released.status, 0, String(released.stderr));
    await sleep(400);
    assert.equal(run.signal.aborted, true);
    run.check();
  });
  await assert.rejects(outcome, LeaseLost);
  assert.equal(await idem.record("k"), undefined);
});

test("a blocked event loop sees its lease run out before the heartbeat runs", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "blocked", leaseMs: 300 });
  const outcome = idem.withIdempotency("k", (run) => {
    run.check();
    const until = performance.now() + 450;
    while (performance.now() < until) {
      // a synchronous stall: no timer, so no heartbeat, can run
    }
    run.check();
    return "acted on a lease nobody extended";
  });
  await assert.rejects(outcome, LeaseLost);
});

test("a holder cut off from idem serve sees its lease run out", async () => {
  const own = await startServer();
  const idem = new Idem({ url: own.url, token: SHOP, scope: "cut-off", leaseMs: 600, retries: 0 });
  let signalled;
  try {
    const outcome = idem.withIdempotency("k", async (run) => {
      run.check();
      await own.stop();
      await sleep(800);
      signalled = run.signal.aborted;
      run.check();
    });
    await assert.rejects(outcome, LeaseLost);
  } finally {
    await own.stop();
  }
  assert.equal(signalled, true, "the heartbeat noticed too");
});

test("steps are journaled and not run again by a later attempt", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "ship" });
  const effects = [];
  const ship = async (run) => {
    const label = await run.step("label", (key) => (effects.push(["label", key]), "L-9"));
    if (run.attempt === 1) throw new Error("carrier timed out after the label");
    await run.step("pickup", (key) => (effects.push(["pickup", key]), "booked"));
    return label;
  };
  await assert.rejects(idem.withIdempotency("o-9", ship), /carrier timed out/);
  assert.equal((await idem.withIdempotency("o-9", ship)).value, "L-9");
  assert.deepEqual(effects.map(([name]) => name), ["label", "pickup"]);
  assert.ok(effects[0][1].startsWith("idem-") && effects[0][1] !== effects[1][1]);
});

test("no tenant sees another tenant's records", async () => {
  const shop = new Idem({ url: server.url, token: SHOP, scope: "tenants" });
  const billing = new Idem({ url: server.url, token: BILLING, scope: "tenants" });
  await shop.withIdempotency("o-1", () => "shop's");
  assert.equal(await billing.record("o-1"), undefined);
  assert.equal((await billing.withIdempotency("o-1", () => "billing's")).kind, "executed");
  assert.deepEqual(await shop.withIdempotency("o-1", () => "again"), { kind: "replayed", value: "shop's" });
  const refused = await new Idem({ url: server.url, token: "x".repeat(20) })
    .withIdempotency("o-1", () => 1)
    .catch((e) => e);
  assert.ok(refused instanceof ApiError);
  assert.equal(refused.status, 401);
});

test("bad input gets a clear error and leaves no claim", async () => {
  const idem = new Idem({ url: server.url, token: SHOP, scope: "bad" });
  const bad = await idem.withIdempotency("has space", () => 1).catch((e) => e);
  assert.ok(bad instanceof ApiError);
  assert.equal(bad.status, 400);
  assert.equal(bad.kind, "bad-request");
  assert.match(bad.detail, /key/);
  // It ran: a result that cannot be stored must not let it run again.
  await assert.rejects(idem.withIdempotency("k1", () => ({ big: 10n })), TypeError);
  assert.equal((await idem.record("k1")).state, "failed");
  await assert.rejects(idem.withIdempotency("k1", () => 1), /cannot be stored/);
  const huge = await idem.withIdempotency("k2", () => "x".repeat(3_000_000)).catch((e) => e);
  assert.ok(huge instanceof ApiError && huge.status === 413, String(huge));
  assert.equal((await idem.record("k2")).state, "failed");
  assert.throws(() => new Idem({ url: "ftp://x" }), TypeError);
  assert.throws(() => new Idem({ url: server.url, leaseMs: 0 }), RangeError);
});
