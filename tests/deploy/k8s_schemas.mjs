// Validates rendered Kubernetes manifests offline, against two sets of schemas:
//
//   node tests/deploy/k8s_schemas.mjs TOOLS_DIR FILE.yaml...
//
// 1. kubernetes-models (JSON schemas, about Kubernetes 1.32): required fields, types and formats
//    of the core and apps kinds. It has no resource.k8s.io kinds (DRA): those are reported as
//    skipped by this check. It accepts unknown fields.
// 2. @kubernetes/client-node's generated models (OpenAPI of Kubernetes 1.34, which has
//    resource.k8s.io/v1): every field must exist where it is written (catches typos such as
//    `readinesProbe`, which the API server would drop with a warning) and have the right JSON
//    type. It knows no required fields.
//
// TOOLS_DIR holds node_modules with tests/deploy/package.json installed (check.sh does that).
// Before the files, a self-test feeds each check a broken object that it must reject.
// Exit status: 0 when every object passes, 1 otherwise.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [toolsDir, ...files] = process.argv.slice(2);
if (!toolsDir) {
  console.error('usage: k8s_schemas.mjs TOOLS_DIR FILE.yaml...');
  process.exit(2);
}
const modules = path.join(path.resolve(toolsDir), 'node_modules');
const require = createRequire(path.join(modules, 'index.js'));
const yaml = require('js-yaml');
const models = await import(
  pathToFileURL(path.join(modules, '@kubernetes/client-node/dist/gen/models/all.js')).href);

// kubernetes-models' class for apiVersion/kind, or null when it has none.
function modelsClass(apiVersion, kind) {
  const id = `kubernetes-models/${apiVersion}/${kind}`;
  try {
    return require(id)[kind];
  } catch (e) {
    if (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED') return null;
    throw e;
  }
}

// Errors from kubernetes-models' validate(), as strings.
function checkModels(doc) {
  const Class = modelsClass(doc.apiVersion, doc.kind);
  if (!Class) return null;
  try {
    new Class(doc).validate();
    return [];
  } catch (e) {
    const details = (e.errors || []).map((x) => `${x.instancePath || '/'} ${x.message}`);
    return details.length ? details : [String(e.message || e)];
  }
}

// Quantities (resources, sizeLimit) are strings in the OpenAPI but may be written as numbers.
const QUANTITY_PATH = /(\/(limits|requests|overhead|capacity|allocatable)\/[^/]+|\/sizeLimit)$/;

// Appends to `errors` every field of `value` (at `where`) that `type` does not allow.
function checkType(value, type, format, where, errors) {
  const got = Array.isArray(value) ? 'array' : value === null ? 'null' : typeof value;
  const expect = (ok, what) => ok || errors.push(`${where}: expected ${what}, got ${got}`);
  if (value === null || type === 'any') return;  // null means "unset" to the API server
  if (type === 'string' || type === 'Date') {
    expect(typeof value === 'string' || (QUANTITY_PATH.test(where) && typeof value === 'number'),
      'string');
  } else if (type === 'number') {
    expect(typeof value === 'number' && (format === 'double' || Number.isInteger(value)),
      format === 'double' ? 'number' : 'integer');
  } else if (type === 'boolean') {
    expect(typeof value === 'boolean', 'boolean');
  } else if (type === 'IntOrString') {
    expect(typeof value === 'string' || Number.isInteger(value), 'integer or string');
  } else if (type.startsWith('Array<')) {
    if (!expect(Array.isArray(value), 'array')) return;
    const inner = type.slice(6, -1);
    value.forEach((v, i) => checkType(v, inner, '', `${where}/${i}`, errors));
  } else if (type.startsWith('{ [key: string]: ')) {
    if (!expect(got === 'object', 'object')) return;
    const inner = type.slice('{ [key: string]: '.length, -'; }'.length);
    for (const [k, v] of Object.entries(value)) checkType(v, inner, '', `${where}/${k}`, errors);
  } else if (models[type]) {
    if (!expect(got === 'object', `object (${type})`)) return;
    const fields = new Map(models[type].attributeTypeMap.map((a) => [a.baseName, a]));
    for (const [k, v] of Object.entries(value)) {
      const field = fields.get(k);
      if (!field) {
        errors.push(`${where}/${k}: unknown field in ${type}`);
      } else {
        checkType(v, field.type, field.format, `${where}/${k}`, errors);
      }
    }
  } else {
    errors.push(`${where}: no model for type ${type}`);
  }
}

// The client-node model name: apps/v1 Deployment -> V1Deployment, resource.k8s.io/v1beta2
// DeviceClass -> V1beta2DeviceClass.
function strictTypeName(doc) {
  const version = String(doc.apiVersion || '').split('/').pop();
  return version.charAt(0).toUpperCase() + version.slice(1) + doc.kind;
}

// Errors from the field-by-field check against the 1.34 OpenAPI.
function checkStrict(doc) {
  const type = strictTypeName(doc);
  if (!models[type]) return [`no Kubernetes 1.34 kind ${doc.apiVersion} ${doc.kind}`];
  const errors = [];
  checkType(doc, type, '', '', errors);
  return errors;
}

// Each check must reject an object that is broken in the way it is meant to catch.
function selfTest() {
  const pod = () => ({
    apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' },
    spec: { containers: [{ name: 'c', image: 'i' }] },
  });
  const claimTemplate = () => ({
    apiVersion: 'resource.k8s.io/v1', kind: 'ResourceClaimTemplate', metadata: { name: 't' },
    spec: { spec: { devices: { requests: [{ name: 'gpu', exactly: { deviceClassName: 'x' } }] } } },
  });
  const cases = [
    ['models accepts a valid Pod', () => checkModels(pod()).length === 0],
    ['strict accepts a valid Pod', () => checkStrict(pod()).length === 0],
    ['strict accepts a valid ResourceClaimTemplate',
      () => checkStrict(claimTemplate()).length === 0],
    ['models rejects a container without a name', () => {
      const p = pod(); delete p.spec.containers[0].name; return checkModels(p).length > 0;
    }],
    ['models rejects a string where an integer belongs', () => {
      const p = pod(); p.spec.terminationGracePeriodSeconds = '60';
      return checkModels(p).length > 0;
    }],
    ['strict rejects a misspelt field', () => {
      const p = pod(); p.spec.containers[0].readinesProbe = {}; return checkStrict(p).length > 0;
    }],
    ['strict rejects a number where a string belongs', () => {
      const p = pod(); p.spec.containers[0].env = [{ name: 'A', value: 1 }];
      return checkStrict(p).length > 0;
    }],
    ['strict rejects an unknown field in a DRA object', () => {
      const t = claimTemplate(); t.spec.spec.devices.requests[0].exactly.deviceClass = 'x';
      return checkStrict(t).length > 0;
    }],
    ['strict rejects an unknown kind', () => checkStrict({ ...pod(), kind: 'Pods' }).length > 0],
  ];
  let failed = 0;
  for (const [name, run] of cases) {
    if (!run()) {
      console.log(`FAIL self-test: ${name}`);
      failed++;
    }
  }
  console.log(`self-test: ${cases.length - failed} of ${cases.length} cases behave`);
  return failed === 0;
}

let ok = selfTest();
for (const file of files) {
  const docs = yaml.loadAll(fs.readFileSync(file, 'utf8')).filter((d) => d);
  for (const doc of docs) {
    const name = `${path.basename(file)}: ${doc.kind}/${doc.metadata && doc.metadata.name}`;
    const modelErrors = checkModels(doc);
    const strictErrors = checkStrict(doc);
    const errors = [...(modelErrors || []).map((e) => `kubernetes-models: ${e}`),
      ...strictErrors.map((e) => `strict 1.34: ${e}`)];
    const note = modelErrors === null ? ' (no kubernetes-models schema for ' +
      `${doc.apiVersion} ${doc.kind}: strict 1.34 field check only)` : '';
    if (errors.length) {
      ok = false;
      console.log(`FAIL ${name}`);
      for (const e of errors) console.log(`       ${e}`);
    } else {
      console.log(`ok   ${name}${note}`);
    }
  }
}
process.exit(ok ? 0 : 1);
