// A real `idem serve` for the tests: the binary named by IDEM_BIN (built by
// scripts/clients), on a free loopback port, over an SQLite file in a
// temporary folder, with two tenants. Stopped with kill() + exit.

import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const SHOP = "shop-token-0123456789abcdef";
export const BILLING = "billing-token-0123456789abcdef";

async function freePort() {
  const probe = createServer().listen(0, "127.0.0.1");
  await once(probe, "listening");
  const { port } = probe.address();
  probe.close();
  await once(probe, "close");
  return port;
}

export async function startServer() {
  const bin = process.env.IDEM_BIN;
  if (!bin) throw new Error("set IDEM_BIN to the idem binary (scripts/clients does)");
  const folder = mkdtempSync(join(tmpdir(), "idem-ts-"));
  writeFileSync(join(folder, "tokens.toml"), `[tenants]\nshop = ["${SHOP}"]\nbilling = ["${BILLING}"]\n`);
  const port = await freePort();
  const log = openSync(join(folder, "serve.log"), "w");
  const child = spawn(
    bin,
    ["--store", `sqlite:${join(folder, "idem.db")}`, "serve", "--listen", `127.0.0.1:${port}`,
     "--tokens", join(folder, "tokens.toml")],
    { stdio: ["ignore", log, log] },
  );
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      if ((await fetch(`${url}/healthz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill();
      throw new Error(readFileSync(join(folder, "serve.log"), "utf8"));
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    folder,
    async stop() {
      child.kill();
      if (child.exitCode === null && child.signalCode === null) await once(child, "exit");
      rmSync(folder, { recursive: true, force: true });
    },
  };
}
