#!/usr/bin/env node
// Parses AsyncAPI documents with the AsyncAPI project's own parser and prints every
// diagnostic, each line starting with the document's path. Exits 1 when any document has
// an error (or the parser makes no document of it), else 0.
// Usage: node tools/asyncapi/validate.cjs DOCUMENT...
// The parser comes from the node_modules that scripts/ensure-asyncapi installed in
// .tools/asyncapi at the top of the repository.
'use strict';
const path = require('path');
const { createRequire } = require('module');

const files = process.argv.slice(2);
const installDir = path.join(__dirname, '..', '..', '.tools', 'asyncapi');
if (files.length === 0) {
  console.error('usage: validate.cjs DOCUMENT...');
  process.exit(2);
}
// Resolved from the install folder, not from this file's: the parser is not in the tree.
const { Parser, fromFile, DiagnosticSeverity } = createRequire(
  path.join(installDir, 'package.json'),
)('@asyncapi/parser');

const SEVERITY = Object.fromEntries(
  Object.entries(DiagnosticSeverity).filter(([, v]) => typeof v === 'number').map(([k, v]) => [v, k]),
);

async function errorsIn(parser, file) {
  const { document, diagnostics } = await fromFile(parser, file).parse();
  let errors = 0;
  for (const d of diagnostics) {
    if (d.severity === DiagnosticSeverity.Error) errors += 1;
    const where = d.path.length ? d.path.join('.') : '(document)';
    console.log(`${file}: ${SEVERITY[d.severity].toLowerCase()} ${d.code} at ${where}: ${d.message}`);
  }
  if (errors > 0 || !document) {
    console.log(`${file}: ${errors} error(s)${document ? '' : ', no document'}`);
    return errors || 1;
  }
  console.log(`${file}: no errors (${diagnostics.length} other diagnostic(s))`);
  return 0;
}

async function main() {
  const parser = new Parser();
  let errors = 0;
  for (const file of files) errors += await errorsIn(parser, file);
  return errors > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(error);
    process.exit(2);
  },
);
