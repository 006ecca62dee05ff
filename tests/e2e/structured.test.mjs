// Structured output through the OpenAI Node SDK on a random-weight model: whatever the weights,
// constrained output is valid (checked with Ajv against the very schema sent, and with zod), and
// n choices, tool_choice required / named, streaming and bad schemas behave as OpenAI's API does.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import Ajv from 'ajv';
import { BINARY, SHARED, startServer } from './helpers.mjs';

const ajv = new Ajv({ strict: false });

const Event = z.object({
  name: z.string().max(20),
  day: z.string().max(10),
  participants: z.array(z.string().max(12)).max(4),
  priority: z.enum(['low', 'high']),
  seats: z.number().int().min(0).max(100),
  confirmed: z.boolean(),
  venue: z.object({ city: z.string().max(16), indoor: z.boolean().nullable() }),
});

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['C', 'F'] } }, required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', description: 'Time in a city', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] } } },
];

let server;
let client;
test.before(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-e2e-'));
  const model = path.join(dir, 'qwen-structured.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', 'tiny-qwen2', '--chat-template', path.join(SHARED, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja'), '-o', model], { stdio: 'ignore' });
  server = await startServer(['-m', model]);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
});
test.after(async () => server && server.stop());

const messages = [{ role: 'user', content: 'Plan an event and answer in JSON.' }];

test('json_schema from zodResponseFormat: every choice parses and validates, n = 3 with seed + index, usage once per prompt', async () => {
  const format = zodResponseFormat(Event, 'event');
  const validate = ajv.compile(format.json_schema.schema);
  const r = await client.chat.completions.parse({ model: 'qwen-structured', messages, response_format: format, n: 3, temperature: 1, seed: 7, max_tokens: 600 });
  assert.equal(r.choices.length, 3);
  const single = await client.chat.completions.create({ model: 'qwen-structured', messages, response_format: format, temperature: 1, seed: 7, max_tokens: 600 });
  assert.equal(r.usage.prompt_tokens, single.usage.prompt_tokens);
  // Completion tokens count every choice (choice 0 is the single request's answer).
  assert.ok(r.usage.completion_tokens > single.usage.completion_tokens + 2);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const value = JSON.parse(c.message.content);
    assert.ok(validate(value), `${c.message.content}\n${JSON.stringify(validate.errors)}`);
    assert.deepEqual(c.message.parsed, Event.parse(value));
  });
  // Choice 0 is the single request with the same seed.
  assert.equal(r.choices[0].message.content, single.choices[0].message.content);
  assert.notEqual(r.choices[1].message.content, r.choices[2].message.content);
});

test('streamed json_schema output adds up to valid JSON, with every choice index', async () => {
  const format = zodResponseFormat(Event, 'event');
  const validate = ajv.compile(format.json_schema.schema);
  const stream = await client.chat.completions.create({ model: 'qwen-structured', messages, response_format: format, n: 2, temperature: 1, seed: 3, max_tokens: 600, stream: true });
  const text = ['', ''];
  const finish = [null, null];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  for (const i of [0, 1]) {
    assert.equal(finish[i], 'stop');
    assert.ok(validate(JSON.parse(text[i])), text[i]);
  }
});

test('json_object, the grammar extension, and max_tokens inside a value', async () => {
  const obj = await client.chat.completions.create({ model: 'qwen-structured', messages, response_format: { type: 'json_object' }, temperature: 0, max_tokens: 300 });
  const content = obj.choices[0].message.content;
  assert.ok(content.startsWith('{'), content);
  if (obj.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(content), 'object');
  const yesNo = await client.chat.completions.create({ model: 'qwen-structured', messages, temperature: 1, seed: 1, max_tokens: 10, grammar: 'root ::= ("yes" | "no") "!"' });
  assert.match(yesNo.choices[0].message.content, /^(yes|no)!$/);
  assert.equal(yesNo.choices[0].finish_reason, 'stop');
  const cut = await client.chat.completions.create({ model: 'qwen-structured', messages, response_format: zodResponseFormat(Event, 'event'), temperature: 0, max_tokens: 4 });
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.ok(cut.choices[0].message.content.startsWith('{'));
});

test('tool_choice required and named: a valid call of the tools, arguments matching their parameters', async () => {
  const byName = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  for (const [tool_choice, parallel] of [['required', true], ['required', false], [{ type: 'function', function: { name: 'get_time' } }, true]]) {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create({ model: 'qwen-structured', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice, parallel_tool_calls: parallel, temperature: 1, seed, max_tokens: 400 });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(m));
      assert.ok(m.tool_calls.length >= 1);
      if (!parallel) assert.equal(m.tool_calls.length, 1);
      for (const call of m.tool_calls) {
        if (typeof tool_choice === 'object') assert.equal(call.function.name, 'get_time');
        assert.ok(byName[call.function.name], call.function.name);
        const args = JSON.parse(call.function.arguments);
        assert.ok(byName[call.function.name](args), `${call.function.arguments} ${JSON.stringify(byName[call.function.name].errors)}`);
      }
    }
  }
});

test('schemas and grammars that cannot be enforced are 400s naming the parameter', async () => {
  const rejects = (body, param, pattern) =>
    assert.rejects(client.chat.completions.create({ model: 'qwen-structured', messages, max_tokens: 5, ...body }), (e) => e.status === 400 && e.param === param && (!pattern || pattern.test(e.message)));
  await rejects({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { a: {} } } } } }, 'response_format', /patternProperties/);
  await rejects({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', format: 'hostname' } } } }, 'response_format', /format/);
  await rejects({ response_format: { type: 'yaml' } }, 'response_format');
  await rejects({ grammar: 'root ::= missing' }, 'grammar', /missing/);
  await rejects({ grammar: 'root ::= root "a" | "b"' }, 'grammar', /left-recursive/);
  await rejects({ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, 'grammar');
  await rejects({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'string', format: 'ipv4' } } } } }], tool_choice: 'required' }, 'tools', /format/);
  await rejects({ n: 0 }, 'n');
  await rejects({ n: 1000 }, 'n');
});
