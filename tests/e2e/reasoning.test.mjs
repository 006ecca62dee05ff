// A thinking model (Qwen3's chat template writes <think> blocks) through the OpenAI Node SDK: the
// reasoning comes back apart from the answer as reasoning_content, streamed or not, and with tools
// the call after the reasoning is parsed into tool_calls. A random-weight model does not think on
// its own, so the `grammar` extension makes it write exactly what a thinking model would.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { BINARY, SHARED, startServer } from './helpers.mjs';

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['C', 'F'] } }, required: ['city', 'unit'] } } },
];
const gbnf = (text) => `root ::= ${JSON.stringify(text)}`;
const reasoning = 'I should look up the weather.';
const thinkThenCall = `<think>\n${reasoning}\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>`;
const thinkThenAnswer = `<think>\n${reasoning}\n</think>\n\nIt is sunny.`;
const messages = [{ role: 'user', content: 'Weather in Paris?' }];

let server;
let client;
test.before(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-e2e-'));
  const model = path.join(dir, 'qwen3-thinking.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', 'tiny-qwen3', '--chat-template', path.join(SHARED, 'templates', 'Qwen-Qwen3-0.6B.jinja'), '-o', model], { stdio: 'ignore' });
  server = await startServer(['-m', model]);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
});
test.after(async () => server && server.stop());

async function streamed(body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const out = { reasoning: '', content: '', calls: [], finish: null };
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      out.reasoning += c.delta.reasoning_content ?? '';
      out.content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        if (!out.calls[t.index]) out.calls[t.index] = { name: '', arguments: '' };
        out.calls[t.index].name += t.function?.name ?? '';
        out.calls[t.index].arguments += t.function?.arguments ?? '';
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

test('reasoning then an answer: reasoning_content apart from content, streamed or not', async () => {
  const body = { model: 'qwen3-thinking', messages, grammar: gbnf(thinkThenAnswer), temperature: 1, seed: 1, max_tokens: 200 };
  const r = await client.chat.completions.create(body);
  assert.equal(r.choices[0].message.reasoning_content, reasoning);
  assert.equal(r.choices[0].message.content, 'It is sunny.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await streamed(body);
  assert.equal(s.reasoning.trim(), reasoning);
  assert.equal(s.content.trim(), 'It is sunny.');
  assert.equal(s.finish, 'stop');
});

test('reasoning then a tool call: reasoning_content and tool_calls, streamed or not', async () => {
  const body = { model: 'qwen3-thinking', messages, tools, grammar: gbnf(thinkThenCall), temperature: 1, seed: 2, max_tokens: 300 };
  const r = await client.chat.completions.create(body);
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, reasoning);
  assert.equal(m.content, null);
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', unit: 'C' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const s = await streamed(body);
  assert.equal(s.reasoning.trim(), reasoning);
  assert.equal(s.content.trim(), '');
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(s.calls[0].arguments), { city: 'Paris', unit: 'C' });
  assert.equal(s.finish, 'tool_calls');
});
