// Type-checks dashboards/gac.json against Grafana's published dashboard
// schema (grafana_schema.ts: GacDashboard, from npm @grafana/schema) with
// TypeScript's compiler (web/node_modules, both pinned in web/package.json).
//
// usage: node check_grafana_schema.mjs REPO
//
// The dashboard is pasted, as written, after
// `const dashboard: GacDashboard =` on its first line, so an error's line and
// column are the dashboard's own. One program (strict, noEmit) also holds
// broken copies of the dashboard, each one mistake away from it (and cut down
// to the panel, annotation or variable with the mistake); every copy must be
// rejected with the expected error, which shows the check bites.
//
// Exits 0 when the dashboard conforms and every broken copy is rejected, 1
// otherwise, 77 (skipped) when web/node_modules lacks typescript or
// @grafana/schema (npm ci --prefix web installs both).

import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '../..'));
const modules = path.join(repo, 'web/node_modules');
const schemaPackage = path.join(modules, '@grafana/schema');
if (!fs.existsSync(path.join(modules, 'typescript/package.json')) || !fs.existsSync(path.join(schemaPackage, 'package.json'))) {
  console.log('check_grafana_schema: web/node_modules lacks typescript or @grafana/schema (npm ci --prefix web): skipped');
  process.exit(77);
}
const ts = createRequire(path.join(modules, 'typescript/package.json'))('typescript');

const checksDir = path.join(repo, 'tests/dashboards');
const dashboardPath = path.join(repo, 'dashboards/gac.json');
const dashboardText = fs.readFileSync(dashboardPath, 'utf8');
const prefix = "import type { GacDashboard } from './grafana_schema';\nexport const dashboard: GacDashboard = ";

// Each broken copy: the dashboard with one mistake, and the text the
// compiler's error must contain (TypeScript is pinned, so its wording is).
const firstOfType = (d, type) => d.panels.find((p) => p.type === type);
const promAnnotation = (d) => d.annotations.list.find((a) => a.datasource.type === 'prometheus');
const variable = (d, name) => d.templating.list.find((v) => v.name === name);
const brokenCopies = [
  {
    name: 'misspelled panel field',
    mutate: (d) => {
      const p = firstOfType(d, 'timeseries');
      p.descripton = p.description;
      delete p.description;
    },
    expect: `'"descripton"' does not exist`,
  },
  {
    name: 'unknown panel type',
    mutate: (d) => (firstOfType(d, 'timeseries').type = 'timeseris'),
    expect: `Type '"timeseris"' is not assignable`,
  },
  {
    name: 'gridPos width as a string',
    mutate: (d) => (firstOfType(d, 'stat').gridPos.w = '5'),
    expect: "Type 'string' is not assignable to type 'number'",
  },
  {
    name: 'misspelled timeseries legend option',
    mutate: (d) => (firstOfType(d, 'timeseries').options.legend.placment = 'bottom'),
    expect: `'"placment"' does not exist`,
  },
  {
    name: 'unknown colour mode',
    mutate: (d) => (firstOfType(d, 'stat').fieldConfig.defaults.color.mode = 'threshold'),
    expect: `Type '"threshold"' is not assignable`,
  },
  {
    name: 'misspelled Prometheus target field',
    mutate: (d) => {
      const t = firstOfType(d, 'stat').targets[0];
      t.exp = t.expr;
      delete t.expr;
    },
    expect: `'"exp"' does not exist`,
  },
  {
    name: 'annotation query at the top level',
    mutate: (d) => {
      const a = promAnnotation(d);
      a.expr = a.target.expr;
      delete a.target;
    },
    expect: `'"expr"' does not exist`,
  },
  {
    name: 'variable with an empty current option',
    mutate: (d) => (variable(d, 'run').current = {}),
    expect: "missing the following properties from type",
  },
  {
    name: 'unknown variable field',
    mutate: (d) => (variable(d, 'job').definition = 'label_values(gac_runs_exported, job)'),
    expect: `'"definition"' does not exist`,
  },
];

const sources = new Map();
const dashboardFile = path.join(checksDir, '__gac_json__.ts');
sources.set(dashboardFile, prefix + dashboardText);
const original = JSON.parse(dashboardText);
// A broken copy keeps, of the dashboard's panels, annotations and
// variables, only those the mistake is in: checking ten whole dashboards
// would take ten times as long.
function trim(copy) {
  const keepChanged = (list, originalList) => list.filter((item, i) => JSON.stringify(item) !== JSON.stringify(originalList[i]));
  copy.panels = keepChanged(copy.panels, original.panels);
  copy.annotations.list = keepChanged(copy.annotations.list, original.annotations.list);
  copy.templating.list = keepChanged(copy.templating.list, original.templating.list);
  return copy;
}
const unmade = [];
brokenCopies.forEach((c, i) => {
  const copy = structuredClone(original);
  c.file = path.join(checksDir, `__gac_json_broken_${i}__.ts`);
  try {
    c.mutate(copy);
  } catch (e) {
    // The dashboard no longer has what the mistake is made in.
    unmade.push(`broken copy "${c.name}" cannot be made from dashboards/gac.json: ${e.message}`);
    return;
  }
  if (JSON.stringify(copy) === JSON.stringify(original)) {
    unmade.push(`broken copy "${c.name}" is no change: dashboards/gac.json already has this mistake`);
    return;
  }
  sources.set(c.file, prefix + JSON.stringify(trim(copy), null, 2));
});

const options = {
  strict: true,
  noEmit: true,
  skipLibCheck: true,
  target: ts.ScriptTarget.ES2022,
  // The types need nothing newer; each further library file costs parse time.
  lib: ['lib.es5.d.ts'],
  types: [],
  module: ts.ModuleKind.ESNext,
  moduleResolution: ts.ModuleResolutionKind.Bundler,
  paths: {
    '@grafana/schema': [path.join(schemaPackage, 'dist/types/index.d.ts')],
    '@grafana/schema/*': [path.join(schemaPackage, '*')],
  },
};
const host = ts.createCompilerHost(options);
const getSourceFile = host.getSourceFile;
host.getSourceFile = (file, language, ...rest) =>
  sources.has(file) ? ts.createSourceFile(file, sources.get(file), language) : getSourceFile(file, language, ...rest);
const fileExists = host.fileExists;
host.fileExists = (file) => sources.has(file) || fileExists(file);

const started = process.hrtime.bigint();
const program = ts.createProgram([path.join(checksDir, 'grafana_schema.ts'), ...sources.keys()], options, host);
const diagnostics = ts.getPreEmitDiagnostics(program);
const seconds = Number(process.hrtime.bigint() - started) / 1e9;

const byFile = new Map();
const failures = [];
for (const d of diagnostics) {
  const key = d.file?.fileName ?? '';
  if (!byFile.has(key)) byFile.set(key, []);
  byFile.get(key).push(d);
}
const message = (d) => ts.flattenDiagnosticMessageText(d.messageText, '\n');

// The dashboard: report each error at its line and column in gac.json.
for (const [file, list] of byFile) {
  if (file === dashboardFile) {
    for (const d of list) {
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
      const column = line === 1 ? character - prefix.split('\n')[1].length : character;
      failures.push(`dashboards/gac.json:${line}:${column + 1}: TS${d.code}: ${message(d)}`);
    }
  } else if (!brokenCopies.some((c) => c.file === file)) {
    failures.push(...list.map((d) => `${file || '(global)'}: TS${d.code}: ${message(d)}`));
  }
}
failures.push(...unmade);
for (const c of brokenCopies.filter((c) => sources.has(c.file))) {
  const messages = (byFile.get(c.file) ?? []).map(message);
  if (!messages.some((m) => m.includes(c.expect))) {
    failures.push(
      `broken copy "${c.name}" not rejected with "${c.expect}"` +
        (messages.length ? `; errors: ${messages.join(' | ')}` : ' (no error)'),
    );
  }
}

if (failures.length) {
  console.log(failures.join('\n'));
  process.exit(1);
}
console.log(
  `check_grafana_schema: dashboards/gac.json conforms to @grafana/schema ${JSON.parse(fs.readFileSync(path.join(schemaPackage, 'package.json'))).version}` +
    ` and ${brokenCopies.length} broken copies are rejected (TypeScript ${ts.version}, ${seconds.toFixed(2)} s)`,
);
