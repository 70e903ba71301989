// The Express middleware (a real server, Node's fetch) and the Fastify
// plugin (Fastify's own inject) on SQLite and Redis: one execution per key,
// byte-exact replays, the tower layer's refusals as problem+json, real
// concurrent duplicates, handlers that fail or throw, and the run's fence
// in the handler. Then the official Stripe SDK retrying past its own
// timeout through Express: one charge.

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { once } from "node:events";
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import express from "express";
import Fastify from "fastify";
import Stripe from "stripe";

import { Idem, InvalidInput } from "../idem.js";
import { fastifyIdempotency, idempotency } from "../http.js";
import { TOKEN, scratch, sleep, startRedis, startServe } from "./stores.mjs";

const folder = scratch();
const redis = await startRedis();
after(() => redis.stop());
let stores = 0;
const open = (name, extra = {}) =>
  new Idem({
    url: name === "sqlite" ? `sqlite:${join(folder, `idem-${++stores}.db`)}` : `${redis.url}/0?namespace=h${++stores}`,
    ...extra,
  });

/** The handler both frameworks mount: counts runs, may wait, fail or throw. */
function handler(state) {
  return async (body, run) => {
    state.runs.push(body);
    if (state.gate) await state.gate;
    if (body.fail) return { status: 503, body: { error: "upstream down" } };
    if (body.throw) throw new Error("the handler broke");
    return { status: 201, body: { charge: `ch_${state.runs.length}`, fence: run.fence } };
  };
}

async function expressApp(idem, options = {}) {
  const state = { runs: [], gate: undefined };
  const handle = handler(state);
  const app = express();
  app.set("env", "test"); // no error logs for the handler that throws
  app.use(express.json());
  app.use(idempotency(idem, options));
  app.post("/charges", async (req, res) => {
    const { status, body } = await handle(req.body, req.idem);
    res.status(status).set("x-charge", "yes").json(body);
  });
  const server = app.listen(0, "127.0.0.1");
  await once(server, "listening");
  const base = `http://127.0.0.1:${server.address().port}`;
  const post = (key, body, headers = {}) =>
    fetch(`${base}/charges`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(key == null ? {} : { "idempotency-key": key }), ...headers },
      body: JSON.stringify(body),
    });
  return { state, post, base, close: () => new Promise((r) => server.close(r)) };
}

async function fastifyApp(idem, options = {}) {
  const state = { runs: [], gate: undefined };
  const handle = handler(state);
  const app = Fastify();
  await app.register(fastifyIdempotency, { idem, ...options });
  app.post("/charges", async (request, reply) => {
    const { status, body } = await handle(request.body, request.idem);
    reply.code(status).header("x-charge", "yes");
    return body;
  });
  await app.ready();
  const post = async (key, body, headers = {}) => {
    const answer = await app.inject({
      method: "POST",
      url: "/charges",
      headers: { "content-type": "application/json", ...(key == null ? {} : { "idempotency-key": key }), ...headers },
      payload: JSON.stringify(body),
    });
    // As fetch answers: status, headers.get, text(), json().
    return {
      status: answer.statusCode,
      headers: { get: (name) => answer.headers[name] ?? null },
      text: async () => answer.body,
      json: async () => JSON.parse(answer.body),
    };
  };
  return { state, post, close: () => app.close() };
}

for (const [framework, make] of [["express", expressApp], ["fastify", fastifyApp]]) {
  for (const store of ["sqlite", "redis"]) {
    describe(`${framework} on ${store}`, () => {
      test("a keyed request runs once and its retries replay it", async () => {
        const app = await make(open(store));
        try {
          const first = await app.post("order-1", { amount: 100 });
          const again = await app.post("order-1", { amount: 100 });
          assert.equal(first.status, 201);
          assert.equal(again.status, 201);
          const [a, b] = [await first.text(), await again.text()];
          assert.equal(b, a);
          assert.equal(JSON.parse(a).charge, "ch_1");
          assert.equal(typeof JSON.parse(a).fence, "number");
          assert.equal(again.headers.get("idempotent-replayed"), "true");
          assert.equal(first.headers.get("idempotent-replayed"), null);
          assert.equal(again.headers.get("x-charge"), "yes");
          assert.ok(Number(first.headers.get("idempotency-key-lifetime")) > 0);
          assert.equal(app.state.runs.length, 1);
        } finally {
          await app.close();
        }
      });

      test("concurrent duplicates run once: 409 with Retry-After, then the replay", async () => {
        const app = await make(open(store));
        try {
          let open_;
          app.state.gate = new Promise((r) => (open_ = r));
          const first = app.post("dup", { amount: 5 });
          while (app.state.runs.length === 0) await sleep(10);
          const busy = await Promise.all([1, 2, 3].map(() => app.post("dup", { amount: 5 })));
          open_();
          const done = await first;
          const later = await app.post("dup", { amount: 5 });
          assert.equal(done.status, 201);
          assert.deepEqual(busy.map((b) => b.status), [409, 409, 409]);
          assert.ok(busy.every((b) => Number(b.headers.get("retry-after")) >= 1));
          assert.equal(later.status, 201);
          assert.equal(await later.text(), await done.text());
          assert.equal(app.state.runs.length, 1);
        } finally {
          await app.close();
        }
      });
    });
  }

  describe(`${framework}: refusals and failures`, () => {
    test("another body under a used key is 422, a malformed key 400, as problem+json", async () => {
      const app = await make(open("sqlite"));
      try {
        await app.post("k", { amount: 1 });
        const mismatch = await app.post("k", { amount: 2 });
        const malformed = await app.post("k".repeat(256), { amount: 1 });
        assert.equal(mismatch.status, 422);
        assert.equal(malformed.status, 400);
        assert.equal(malformed.headers.get("content-type"), "application/problem+json");
        assert.match((await malformed.json()).detail, /at most 255/);
        assert.equal(app.state.runs.length, 1);
      } finally {
        await app.close();
      }
    });

    test("a required key is enforced; unkeyed requests otherwise pass through", async () => {
      const strict = await make(open("sqlite"), { required: true });
      const loose = await make(open("sqlite"));
      try {
        assert.equal((await strict.post(null, { amount: 1 })).status, 400);
        assert.equal(strict.state.runs.length, 0);
        assert.equal((await loose.post(null, { amount: 1 })).status, 201);
        assert.equal((await loose.post(null, { amount: 1 })).status, 201);
        assert.equal(loose.state.runs.length, 2);
      } finally {
        await strict.close();
        await loose.close();
      }
    });

    test("a 5xx or a throwing handler (answered 500) releases the key", async () => {
      const app = await make(open("sqlite"));
      try {
        assert.equal((await app.post("a", { fail: true })).status, 503);
        assert.equal((await app.post("a", { fail: true })).status, 503);
        assert.equal((await app.post("b", { throw: true })).status, 500);
        assert.equal((await app.post("b", { throw: true })).status, 500);
        assert.equal(app.state.runs.length, 4);
      } finally {
        await app.close();
      }
    });
  });
}

test("reference keeps the body in a blob beside the store and replays it", async () => {
  const dir = scratch();
  const idem = new Idem({ url: `sqlite:${join(dir, "idem.db")}` });
  const app = await expressApp(idem, { keep: "/charges=reference:10" });
  try {
    const first = await app.post("big-1", { amount: 100 });
    const again = await app.post("big-1", { amount: 100 });
    const body = await first.text();
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(await again.text(), body);
    assert.equal(app.state.runs.length, 1);
  } finally {
    await app.close();
  }
  const blobs = join(dir, "idem.db.blobs");
  const files = readdirSync(blobs).flatMap((d) => readdirSync(join(blobs, d)));
  assert.equal(files.length, 1);
});

test("status-only replays the status, and a sealed store file shows no result", async () => {
  const dir = scratch();
  writeFileSync(join(dir, "keys"), `2026-11:${"cd".repeat(32)}\n`);
  writeFileSync(join(dir, "key-secret"), `${"ef".repeat(32)}\n`);
  const idem = new Idem({
    url: `sqlite:${join(dir, "idem.db")}`,
    keyring: join(dir, "keys"),
    keySecret: join(dir, "key-secret"),
  });
  const app = await expressApp(idem, { keep: "/charges=status-only:x-charge" });
  try {
    const first = await app.post("mint-1", { amount: 100 });
    const again = await app.post("mint-1", { amount: 100 });
    assert.equal(first.status, 201);
    assert.equal(JSON.parse(await first.text()).charge, "ch_1");
    assert.equal(again.status, 201);
    assert.equal(await again.text(), "");
    assert.equal(again.headers.get("idempotent-replay-kept"), "status-only");
    assert.equal(again.headers.get("x-charge"), "yes");
    assert.equal(app.state.runs.length, 1);
  } finally {
    await app.close();
  }
  const dump = Buffer.concat(
    readdirSync(dir)
      .filter((name) => name.startsWith("idem.db"))
      .map((name) => readFileSync(join(dir, name))),
  );
  assert.equal(dump.includes("ch_1"), false);
  assert.equal(dump.includes("mint-1"), false);
  assert.throws(() => idempotency(open("sqlite"), { keep: "forget-it" }), InvalidInput);
  writeFileSync(join(dir, "bad"), "k:not-hex\n");
  assert.throws(() => new Idem({ url: `sqlite:${join(dir, "b.db")}`, keyring: join(dir, "bad") }), /keyring/);
});

test("keys in the body and webhook signatures are the tower layer's", async () => {
  const keyed = await expressApp(open("sqlite"), { required: true, keyInBody: "/order" });
  try {
    const first = await keyed.post(null, { order: "o-1", amount: 1 });
    const again = await keyed.post(null, { amount: 1, order: "o-1" });
    const keyless = await keyed.post(null, { amount: 1 });
    assert.equal(first.status, 201);
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(keyless.status, 400);
    assert.match((await keyless.json()).detail, /JSON pointer "\/order"/);
    assert.equal(keyed.state.runs.length, 1);
  } finally {
    await keyed.close();
  }

  // Standard Webhooks: HMAC-SHA256 over "id.timestamp.body", base64.
  const key = Buffer.from("a webhook signing key");
  const runs = [];
  const app = express();
  app.use(idempotency(open("sqlite"), { webhook: "standard", webhookSecret: `whsec_${key.toString("base64")}` }));
  app.post("/hooks", (req, res) => {
    runs.push(JSON.parse(req.body));
    res.status(204).end();
  });
  const server = app.listen(0, "127.0.0.1");
  await once(server, "listening");
  try {
    const body = JSON.stringify({ type: "invoice.paid" });
    const timestamp = String(Math.floor(Date.now() / 1000));
    const signature = createHmac("sha256", key).update(`msg_1.${timestamp}.${body}`).digest("base64");
    const deliver = (sig) =>
      fetch(`http://127.0.0.1:${server.address().port}/hooks`, {
        method: "POST",
        headers: { "webhook-id": "msg_1", "webhook-timestamp": timestamp, "webhook-signature": `v1,${sig}` },
        body,
      });
    const forged = await deliver(Buffer.from("forged").toString("base64"));
    assert.equal(forged.status, 400);
    assert.match((await forged.json()).type, /bad-signature$/);
    assert.equal((await deliver(signature)).status, 204);
    assert.equal((await deliver(signature)).headers.get("idempotent-replayed"), "true");
    assert.deepEqual(runs, [{ type: "invoice.paid" }]);
  } finally {
    await new Promise((r) => server.close(r));
  }
  assert.throws(() => idempotency(open("sqlite"), { webhook: "github" }), /signing secret/);
});

test("over a remote idem serve the middleware is refused before anything runs", async () => {
  const serve = await startServe(scratch());
  try {
    const idem = new Idem({ url: serve.url, token: TOKEN });
    assert.throws(() => idempotency(idem), (e) => e instanceof InvalidInput && /remote idem serve/.test(e.message));
    assert.throws(() => idempotency(open("sqlite"), { fingerprint: "body" }), InvalidInput);
  } finally {
    await serve.kill();
  }
});

test("the Stripe SDK retrying past its timeout through Express charges once", async () => {
  const executions = [];
  const attempts = [];
  const app = express();
  app.use((req, res, next) => {
    attempts.push(req.get("idempotency-key"));
    next();
  });
  app.use(express.urlencoded({ extended: false }));
  // A short lease: the 409's Retry-After (the lease left) paces the SDK.
  app.use(idempotency(open("sqlite", { leaseMs: 2000 })));
  app.post("/v1/charges", async (req, res) => {
    executions.push(req.body);
    if (executions.length === 1) await sleep(1500); // past the SDK's 500 ms timeout
    res.json({ id: `ch_${executions.length}`, object: "charge", amount: Number(req.body.amount) });
  });
  const server = app.listen(0, "127.0.0.1");
  await once(server, "listening");
  try {
    const stripe = new Stripe("sk_test_idem", {
      host: "127.0.0.1",
      port: server.address().port,
      protocol: "http",
      maxNetworkRetries: 8,
      timeout: 500,
    });
    const charge = await stripe.charges.create({ amount: 1250, currency: "eur" });
    const second = await stripe.charges.create({ amount: 1250, currency: "eur" });
    assert.equal(charge.id, "ch_1");
    assert.equal(charge.amount, 1250);
    assert.equal(second.id, "ch_2");
    assert.equal(executions.length, 2);
    const retried = attempts.filter((key) => key === attempts[0]);
    assert.ok(attempts[0] && retried.length >= 2, JSON.stringify(attempts));
    assert.equal(new Set(attempts).size, 2);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
