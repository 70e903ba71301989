// The README's first example, run as written, in a folder of the test's own
// (it opens sqlite:idem.db there).

import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { scratch } from "./stores.mjs";

test("the README example runs", async () => {
  const readme = readFileSync(fileURLToPath(new URL("../README.md", import.meta.url)), "utf8");
  const [, example] = readme.match(/```js\n([\s\S]*?)```/);
  const folder = scratch();
  const file = join(folder, "example.mjs");
  const pkg = pathToFileURL(fileURLToPath(new URL("../idem.js", import.meta.url))).href;
  writeFileSync(file, example.replace('from "idem-engine"', `from ${JSON.stringify(pkg)}`));
  const cwd = process.cwd();
  process.chdir(folder);
  try {
    await import(pathToFileURL(file).href);
  } finally {
    process.chdir(cwd);
  }
  assert.ok(existsSync(join(folder, "idem.db")));
});
