// The README's first example, run as written against a real idem serve.

import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { SHOP, startServer } from "./server.mjs";

test("the README example runs", async () => {
  const here = fileURLToPath(new URL(".", import.meta.url));
  const readme = readFileSync(join(here, "..", "README.md"), "utf8");
  const example = /```ts\n([\s\S]*?)```/.exec(readme)[1]
    .replace(`from "idem-client"`, `from ${JSON.stringify(pathToFileURL(join(here, "..", "dist", "index.js")).href)}`)
    .replaceAll("console.assert(", "assert.ok(");
  const server = await startServer();
  try {
    process.env.IDEM_URL = server.url;
    process.env.IDEM_TOKEN = SHOP;
    const file = join(server.folder, "example.mjs");
    writeFileSync(file, `import assert from "node:assert/strict";\n${example}`);
    await import(pathToFileURL(file).href);
  } finally {
    await server.stop();
  }
});
