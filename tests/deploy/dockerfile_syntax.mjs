// Lints Dockerfiles with dockerfile-utils (the parser and validator behind VS Code's Docker
// language service): unknown instructions and flags, malformed arguments (ports, durations,
// JSON forms), deprecated instructions, casing. Every diagnostic, warning or error, fails.
//
//   node tests/deploy/dockerfile_syntax.mjs TOOLS_DIR Dockerfile...
//
// A self-test first feeds it a broken Dockerfile that it must reject. The project's own rules
// (non-root user, health check, build stages, apt hygiene) are in invariants.py.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [toolsDir, ...files] = process.argv.slice(2);
if (!toolsDir) {
  console.error('usage: dockerfile_syntax.mjs TOOLS_DIR Dockerfile...');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(toolsDir), 'node_modules', 'index.js'));
const { validate, ValidationSeverity } = require('dockerfile-utils');

// Every optional rule on (by default some are off): MAINTAINER, casing, JSON in single quotes,
// several CMD/ENTRYPOINT/HEALTHCHECK in one stage, relative WORKDIR, empty continuation lines.
const settings = Object.fromEntries([
  'deprecatedMaintainer', 'directiveCasing', 'emptyContinuationLine', 'instructionCasing',
  'instructionCmdMultiple', 'instructionEntrypointMultiple', 'instructionHealthcheckMultiple',
  'instructionJSONInSingleQuotes', 'instructionWorkdirRelative',
].map((rule) => [rule, ValidationSeverity.ERROR]));

// Diagnostics as "line N: message" strings.
function lint(text) {
  return validate(text, settings).map((d) => `line ${d.range.start.line + 1}: ${d.message}`);
}

const broken = [
  'FROM debian:12-slim AS build',
  'COPY --form=build /a /b',
  'EXPOSE 80x80',
  'HEALTHCHECK --start-perid=1s CMD ["true"]',
  'USR 1000',
  'MAINTAINER someone',
  'workdir src',
].join('\n');
const found = lint(broken);
let ok = found.length >= 7;
console.log(`self-test: ${found.length} of 7 planted mistakes reported${ok ? '' : ' (FAIL)'}`);

for (const file of files) {
  const problems = lint(fs.readFileSync(file, 'utf8'));
  if (problems.length) {
    ok = false;
    console.log(`FAIL ${file}`);
    for (const p of problems) console.log(`       ${p}`);
  } else {
    console.log(`ok   ${file}`);
  }
}
process.exit(ok ? 0 : 1);
