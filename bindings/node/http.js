// The Idempotency-Key middleware for Express and Fastify. Every decision
// (key rules, fingerprints, which answer for which state, the status
// table) is the engine's: the same code as the Rust tower layer's. These
// adapters only hand requests over and responses back.

"use strict";

const { Readable } = require("node:stream");

const native = require("./native.js");
const { RunContext } = require("./idem.js");
const { call, sync } = require("./errors.js");

/** What a handler's response is when it could not be handed over. */
const BROKEN = {
  status: 500,
  headers: ["content-type", "text/plain; charset=utf-8"],
  body: Buffer.from("Internal Server Error"),
};

/** The engine's middleware over `idem`'s store, and the tenant hook. */
function guardOf(idem, options) {
  const { tenant, ...rest } = options;
  const guard = sync(() => new native.HttpGuard(idem.engine, { ...rest, tenant: tenant !== undefined }));
  return { guard, tenant };
}

function isTurn(begun) {
  return typeof begun.finish === "function";
}

function buffer(chunk, encoding) {
  if (chunk == null) return Buffer.alloc(0);
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk), typeof encoding === "string" ? encoding : "utf8");
}

async function readAll(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(buffer(chunk));
  return Buffer.concat(chunks);
}

/** `getHeaders()` as alternating names and values. */
function flat(headers) {
  const lines = [];
  for (const [name, value] of Object.entries(headers)) {
    for (const one of Array.isArray(value) ? value : [value]) lines.push(name, String(one));
  }
  return lines;
}

/** Alternating names and values as `{ name: value | [values] }`. */
function grouped(lines) {
  const headers = {};
  for (let i = 0; i + 1 < lines.length; i += 2) {
    const [name, value] = [lines[i], lines[i + 1]];
    if (headers[name] === undefined) headers[name] = value;
    else headers[name] = [].concat(headers[name], value);
  }
  return headers;
}

/** The request's body: what a body parser mounted earlier made of it, or the stream. */
async function expressBody(req) {
  if (req.body !== undefined) {
    if (Buffer.isBuffer(req.body)) return req.body;
    return Buffer.from(typeof req.body === "string" ? req.body : JSON.stringify(req.body));
  }
  const body = await readAll(req);
  // Read here, so body parsers mounted later skip it.
  req.body = body;
  req._body = true;
  return body;
}

function sendExpress(res, answer) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = answer.status;
  for (const [name, value] of Object.entries(grouped(answer.headers))) res.setHeader(name, value);
  res.end(answer.body);
}

/**
 * Holds what the app writes to `res`; when it ends, `finish(response)`
 * gives the answer that is sent instead.
 */
function holdExpress(res, finish) {
  const chunks = [];
  const { write, end, writeHead } = res;
  res.writeHead = function held(status, reason, headers) {
    res.statusCode = status;
    const given = typeof reason === "string" ? headers : reason;
    if (given && !Array.isArray(given)) {
      for (const [name, value] of Object.entries(given)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function held(chunk, encoding, done) {
    chunks.push(buffer(chunk, encoding));
    const callback = typeof encoding === "function" ? encoding : done;
    if (callback) process.nextTick(callback);
    return true;
  };
  res.end = function held(chunk, encoding, done) {
    if (chunk != null && typeof chunk !== "function") chunks.push(buffer(chunk, encoding));
    Object.assign(res, { write, end, writeHead });
    const made = { status: res.statusCode, headers: flat(res.getHeaders()), body: Buffer.concat(chunks) };
    finish(made).then(
      (answer) => sendExpress(res, answer),
      () => sendExpress(res, BROKEN),
    );
    const callback = [chunk, encoding, done].find((f) => typeof f === "function");
    if (callback) res.once("finish", callback);
    return res;
  };
}

/**
 * Express middleware: covered requests (POST and PATCH by default) with an
 * `Idempotency-Key` run once; a retry gets the stored response with
 * `Idempotent-Replayed: true`, a duplicate in flight 409 with `Retry-After`
 * (or the first answer, with `Prefer: wait=N`), the same key with another
 * body 422, a malformed key 400, all as `application/problem+json`. 2xx and
 * 4xx responses are stored (except 408, 409, 425, 429); anything else,
 * and an error that Express answers with 500, releases the key.
 *
 * Mount it after your body parser (`express.json()`): the fingerprint
 * covers what it parsed. Without one, the raw body is read into `req.body`
 * as a Buffer. With `webhook`, mount it before any body parser, so the
 * signature is checked over the bytes that were signed. The handler finds its run in `req.idem` (`fence`, `check()`,
 * `step`). The response is held whole before it is sent (it is stored).
 *
 * Options: `tenant(req)` names the verified caller (keys are then its own);
 * `methods`, `header`, `required`, `fingerprint` ("request", "off" or JSON
 * pointers), `maxRequestBytes`, `maxResponseBytes`, `maxWaitMs`,
 * `defaultWaitMs`, `forwardTakeovers`, `rejectOldUuidV7`, `keep` (what is
 * stored for replays: "full", "status-only", "redacted:/card/number",
 * "reference"), `blobs` (where "reference" keeps bodies: "dir:PATH",
 * "postgres://…"; default a directory beside the embedded store),
 * `keyInBody` ("/id", "fields:/a,/b": the key of a request without the
 * header, from its JSON body), `webhook` ("standard", "stripe", "github")
 * with `webhookSecret` (signatures checked before a key is claimed; mount
 * the middleware before any body parser, so it checks the signed bytes),
 * and `mcp` (MCP tool calls keyed by this tool argument).
 */
function idempotency(idem, options = {}) {
  const { guard, tenant } = guardOf(idem, options);
  async function handle(req, res, next) {
    const begun = await call(() =>
      expressBody(req).then((body) =>
        guard.begin({
          method: req.method,
          target: req.originalUrl,
          headers: req.rawHeaders,
          body,
          tenant: tenant?.(req) ?? undefined,
        }),
      ),
    );
    if (!isTurn(begun)) {
      sendExpress(res, begun);
      return;
    }
    const run = new RunContext(`${req.method} ${req.path}`, begun.context);
    req.idem = run;
    holdExpress(res, (made) => {
      run.unwatch();
      return call(() => begun.finish(made));
    });
    next();
  }
  return function idemMiddleware(req, res, next) {
    if (!guard.covers(req.method)) {
      next();
      return;
    }
    handle(req, res, next).catch(next);
  };
}

const TURN = Symbol("idem.turn");

function sendFastify(reply, answer) {
  reply.code(answer.status);
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
  reply.headers(grouped(answer.headers));
  return answer.body;
}

/**
 * The Fastify plugin: `fastify.register(fastifyIdempotency, { idem, ...options })`.
 * The answers and options are those of `idempotency` (with `tenant(request)`);
 * the handler finds its run in `request.idem`. It applies to the routes of
 * the context it is registered in and its children.
 */
function fastifyIdempotency(fastify, options, done) {
  const { idem, ...rest } = options;
  let made;
  try {
    made = guardOf(idem, rest);
  } catch (error) {
    done(error);
    return;
  }
  const { guard, tenant } = made;
  fastify.decorateRequest("idem", null);
  fastify.addHook("preParsing", async (request, reply, payload) => {
    if (!guard.covers(request.method)) return payload;
    const body = await readAll(payload);
    const begun = await call(() =>
      guard.begin({
        method: request.method,
        target: request.url,
        headers: request.raw.rawHeaders,
        body,
        tenant: tenant?.(request) ?? undefined,
      }),
    );
    if (!isTurn(begun)) {
      reply.send(sendFastify(reply, begun));
      return reply;
    }
    request.idem = new RunContext(`${request.method} ${request.url}`, begun.context);
    request[TURN] = begun;
    return Readable.from([body]);
  });
  fastify.addHook("onSend", async (request, reply, payload) => {
    const turn = request[TURN];
    if (turn === undefined) return payload;
    request[TURN] = undefined;
    request.idem.unwatch();
    const body = payload instanceof Readable ? await readAll(payload) : buffer(payload);
    const response = { status: reply.statusCode, headers: flat(reply.getHeaders()), body };
    const answer = await call(() => turn.finish(response)).catch(() => BROKEN);
    return sendFastify(reply, answer);
  });
  done();
}
// Like fastify-plugin: the hooks apply where the plugin is registered.
fastifyIdempotency[Symbol.for("skip-override")] = true;
fastifyIdempotency[Symbol.for("fastify.display-name")] = "idem-engine";

module.exports = { idempotency, fastifyIdempotency };
