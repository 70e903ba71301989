// Real stores for the tests, each a child process on a free loopback port,
// stopped with kill() and awaited: `idem serve` (the binary named by
// IDEM_BIN, built by scripts/clients) over an SQLite file, restartable on
// its port, and `redis-server`. `eachStore` names the three stores a test
// runs on: SQLite (the default store), Redis and a remote idem serve.

import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const TOKEN = "shop-token-0123456789abcdef";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function freePort() {
  const probe = createServer().listen(0, "127.0.0.1");
  await once(probe, "listening");
  const { port } = probe.address();
  probe.close();
  await once(probe, "close");
  return port;
}

async function stop(child) {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill("SIGKILL");
    await once(child, "exit");
  }
}

export function scratch() {
  return mkdtempSync(join(tmpdir(), "idem-node-"));
}

/** An idem serve over an SQLite file in `folder`, restartable on its port. */
export async function startServe(folder = scratch()) {
  const bin = process.env.IDEM_BIN;
  if (!bin) throw new Error("set IDEM_BIN to the idem binary (scripts/clients does)");
  writeFileSync(join(folder, "tokens.toml"), `[tenants]\nshop = ["${TOKEN}"]\n`);
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const serve = {
    url,
    folder,
    child: undefined,
    async start() {
      const log = openSync(join(folder, "serve.log"), "a");
      this.child = spawn(
        bin,
        ["--store", `sqlite:${join(folder, "serve.db")}`, "serve", "--listen", `127.0.0.1:${port}`,
         "--tokens", join(folder, "tokens.toml")],
        { stdio: ["ignore", log, log] },
      );
      const deadline = Date.now() + 30_000;
      for (;;) {
        try {
          if ((await fetch(`${url}/healthz`)).ok) return;
        } catch {
          // not listening yet
        }
        if (this.child.exitCode !== null || Date.now() > deadline) {
          await stop(this.child);
          throw new Error(readFileSync(join(folder, "serve.log"), "utf8"));
        }
        await sleep(50);
      }
    },
    async kill() {
      await stop(this.child);
    },
  };
  await serve.start();
  return serve;
}

/** A redis-server of the tests' own; its URL, and how to stop it. */
export async function startRedis() {
  const port = await freePort();
  const folder = scratch();
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "",
    "--appendonly", "no", "--dir", folder], { stdio: "ignore" });
  const deadline = Date.now() + 10_000;
  for (;;) {
    const ok = await new Promise((resolve) => {
      const socket = connect(port, "127.0.0.1", () => (socket.end(), resolve(true)));
      socket.on("error", () => resolve(false));
    });
    if (ok) break;
    if (Date.now() > deadline) {
      await stop(child);
      throw new Error("redis-server did not start");
    }
    await sleep(50);
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      await stop(child);
      rmSync(folder, { recursive: true, force: true });
    },
  };
}

/** The three stores, started; `options(name)` opens an Idem on one. */
export async function eachStore() {
  const folder = scratch();
  const redis = await startRedis();
  const serve = await startServe(folder);
  return {
    names: ["sqlite", "redis", "serve"],
    serve,
    options(name) {
      if (name === "sqlite") return { url: `sqlite:${join(folder, "idem.db")}` };
      if (name === "redis") return { url: `${redis.url}/0?namespace=node` };
      return { url: serve.url, token: TOKEN };
    },
    async stop() {
      await serve.kill();
      await redis.stop();
      rmSync(folder, { recursive: true, force: true });
    },
  };
}
