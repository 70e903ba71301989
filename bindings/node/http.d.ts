/**
 * The Idempotency-Key middleware for Express and Fastify, deciding as the
 * Rust tower layer does (it is the same code).
 *
 * ```ts
 * import express from "express";
 * import { Idem } from "idem-engine";
 * import { idempotency } from "idem-engine/http";
 *
 * const app = express();
 * app.use(express.json());
 * app.use(idempotency(new Idem({ url: "sqlite:idem.db" })));
 * app.post("/charges", (req, res) => res.status(201).json({ fence: req.idem.fence }));
 * ```
 */

import type { Idem, RunContext } from "./idem";

/** How the middleware treats requests; unset: the tower layer's defaults. */
export interface IdempotencyOptions<Req> {
  /** Names the verified caller; keys are then its own [default: keys are shared]. */
  tenant?: (request: Req) => string | undefined;
  /** The methods covered [default: POST and PATCH]. */
  methods?: string[];
  /** The key header [default: Idempotency-Key]. */
  header?: string;
  /** Whether a covered request without a key is refused with 400 [default: false]. */
  required?: boolean;
  /** "request" (method, path, query, body), "off", or the JSON pointers fingerprinted [default: "request"]. */
  fingerprint?: "request" | "off" | string[];
  /** The largest request body read, bytes [default: 1 MiB; 413 beyond]. */
  maxRequestBytes?: number;
  /** The largest response stored, bytes [default: 1 MiB]. */
  maxResponseBytes?: number;
  /** The longest a duplicate in flight waits with `Prefer: wait=N`, ms [default: 10000]. */
  maxWaitMs?: number;
  /** How long a duplicate in flight waits without it, ms [default: 0: 409 at once]. */
  defaultWaitMs?: number;
  /** Whether a key whose earlier attempt died mid-request runs again [default: false: 422]. */
  forwardTakeovers?: boolean;
  /** Whether UUIDv7 keys older than the retention are refused [default: false]. */
  rejectOldUuidV7?: boolean;
  /** What is stored for replays: "full", "status-only", "redacted:/card/number,x-api-key", "reference" (bodies over 64 KiB in a blob store), per path prefix "/tokens=status-only;/users=redacted:/ssn" [default: "full"]. */
  keep?: string;
  /** Where bodies kept by `reference` go: `dir:PATH`, `postgres://…` (default: a directory beside the embedded store). */
  blobs?: string;
  /** Where a request without the key header has its key in its JSON body: "/id", "composite:/a,/b", "fields:/a,/b" (a hash of those fields) [default: none]. */
  keyInBody?: string;
  /** A webhook sender whose signatures are checked before a key is claimed: "standard" (Standard Webhooks), "stripe", "github"; keys are then where it puts its event id, and required. Mount the middleware before any body parser, so it checks the bytes that were signed [default: none]. */
  webhook?: "standard" | "stripe" | "github";
  /** The webhook sender's signing secret (`whsec_…`). */
  webhookSecret?: string;
  /** Serve MCP tool calls keyed by this tool argument, e.g. "idempotency_key": replays answer the retry's JSON-RPC id, marked replayed in the result's `_meta` [default: off]. */
  mcp?: string;
}

/** Express middleware; the handler finds its run in `req.idem`. Mount it after the body parser. */
export function idempotency(
  idem: Idem,
  options?: IdempotencyOptions<any>,
): (req: any, res: any, next: (error?: unknown) => void) => void;

/** The Fastify plugin; the handler finds its run in `request.idem`. */
export function fastifyIdempotency(
  fastify: any,
  options: IdempotencyOptions<any> & { idem: Idem },
  done: (error?: Error) => void,
): void;
