// Random JSON Schemas, random walks through their grammars over the real Qwen3 vocabulary
// (`promptly bench grammar --samples`): every finished walk must parse and validate against its
// schema with Ajv, an independent JSON Schema validator.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { BINARY, SHARED } from './helpers.mjs';

const ajv = new Ajv({ strict: false });
addFormats(ajv);

// A small deterministic generator (mulberry32) so a failure names a reproducible seed.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomSchema(r, depth, defs) {
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const leaf = () => pick([
    () => ({ type: 'string', maxLength: 1 + Math.floor(r() * 12), ...(r() < 0.3 ? { minLength: 1 } : {}) }),
    () => ({ type: 'string', format: pick(['date', 'time', 'date-time', 'uuid', 'email']) }),
    () => ({ type: 'string', pattern: pick(['^[a-z]{2,4}-[0-9]{3}$', '^(yes|no)$', '^\\d{2}\\.\\d$', '^[A-F0-9]+$']) }),
    () => { const lo = Math.floor(r() * 200) - 100; return { type: 'integer', minimum: lo, maximum: lo + Math.floor(r() * 1000) }; },
    () => ({ type: 'integer' }),
    () => { const lo = Math.floor(r() * 20) - 10; return { type: 'number', minimum: lo, maximum: lo + 1 + Math.floor(r() * 30) }; },
    () => ({ type: 'number' }),
    () => ({ type: 'boolean' }),
    () => ({ type: 'null' }),
    () => ({ enum: ['red', 'green', 42, null, true] }),
    () => ({ const: 'fixed' }),
    () => ({ type: ['string', 'null'], maxLength: 5 }),
  ])();
  if (depth <= 0 || r() < 0.35) return leaf();
  return pick([
    () => {
      const props = {};
      const n = 1 + Math.floor(r() * 4);
      for (let i = 0; i < n; i++) props[`k${i}_${Math.floor(r() * 100)}`] = randomSchema(r, depth - 1, defs);
      const names = Object.keys(props);
      return { type: 'object', properties: props, required: names.filter(() => r() < 0.6), ...(r() < 0.3 ? { additionalProperties: false } : {}) };
    },
    () => ({ type: 'array', items: randomSchema(r, depth - 1, defs), maxItems: 1 + Math.floor(r() * 3), ...(r() < 0.3 ? { minItems: 1 } : {}) }),
    () => ({ type: 'array', prefixItems: [randomSchema(r, depth - 1, defs), randomSchema(r, depth - 1, defs)] }),
    () => ({ anyOf: [randomSchema(r, depth - 1, defs), randomSchema(r, depth - 1, defs)] }),
    () => { const s = leaf(); return typeof s.type === 'string' ? { ...s, nullable: true } : s; },  // Ajv takes nullable beside a single type only
    () => { const name = `d${Object.keys(defs).length}`; defs[name] = randomSchema(r, depth - 1, defs); return { $ref: `#/$defs/${name}` }; },
  ])();
}

test('random schemas: every finished random walk over the Qwen3 vocabulary validates with Ajv', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-grammar-'));
  const vocab = path.join(SHARED, 'tokenizers', 'qwen3', 'tokenizer.json');
  let walks = 0;
  for (let seed = 1; seed <= 10; seed++) {
    const r = rng(seed);
    const defs = {};
    const schema = randomSchema(r, 3, defs);
    if (Object.keys(defs).length) schema.$defs = defs;
    const schemaFile = path.join(dir, `schema-${seed}.json`);
    const samples = path.join(dir, `samples-${seed}.jsonl`);
    writeFileSync(schemaFile, JSON.stringify(schema));
    execFileSync(BINARY, ['bench', 'grammar', '--vocab', vocab, '--schema', schemaFile, '--walks', '6', '--max-tokens', '3000', '--seed', String(seed), '--samples', samples, '--json'],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    const validate = ajv.compile(schema);
    const lines = readFileSync(samples, 'utf8').split('\n').filter(Boolean);
    assert.ok(lines.length >= 3, `seed ${seed}: only ${lines.length} of 6 walks finished\n${JSON.stringify(schema)}`);
    for (const line of lines) {
      const text = JSON.parse(line);
      let value;
      assert.doesNotThrow(() => { value = JSON.parse(text); }, `seed ${seed}: not JSON: ${text}`);
      assert.ok(validate(value), `seed ${seed}: ${text}\nschema ${JSON.stringify(schema)}\n${JSON.stringify(validate.errors)}`);
      walks++;
    }
  }
  assert.ok(walks >= 30);
});
