// promptly serve through the official OpenAI Node SDK (and raw HTTP where the SDK would refuse to
// send the request): the API surface, greedy equivalence with `promptly run`, errors, disconnects.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import net from 'node:net';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { BINARY, SHARED, STORIES, startServer, runGreedy, metrics, waitFor } from './helpers.mjs';

let server;
let client;

before(async () => {
  server = await startServer(['-m', STORIES, '--kv-type', 'f32']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  assert.equal(await server.stop(), 0, 'a clean exit on SIGTERM');
});

test('health and models', async () => {
  assert.equal((await fetch(`${server.baseURL}/health`)).status, 200);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['stories260K']);
});

test('non-streaming completion equals promptly run (greedy)', async () => {
  const prompt = 'Once upon a time';
  const want = runGreedy(STORIES, prompt, 40);
  const r = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 40, temperature: 0 });
  assert.equal(r.choices[0].text, want.text);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, want.prompt_ids.length);
  assert.equal(r.usage.completion_tokens, 40);
  assert.equal(r.usage.total_tokens, want.prompt_ids.length + 40);
});

test('streaming completion delivers the same text, then usage and [DONE]', async () => {
  const prompt = 'The little dog';
  const want = runGreedy(STORIES, prompt, 30);
  const stream = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, want.text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 30);
});

test('chat streaming and non-streaming agree; the role comes first', async () => {
  const messages = [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'A cat and a ball.' }];
  const full = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 25, temperature: 0 });
  assert.equal(full.object, 'chat.completion');
  assert.equal(full.choices[0].message.role, 'assistant');
  const stream = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 25, temperature: 0, stream: true });
  let text = '';
  let first = true;
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (first) assert.equal(c.delta.role, 'assistant');
    first = false;
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, full.choices[0].finish_reason);
});

test('stop strings end generation and are never shown, even across tokens', async () => {
  const prompt = 'Once upon a time';
  const full = runGreedy(STORIES, prompt, 60).text;
  const stop = full.slice(full.indexOf('little'), full.indexOf('little') + 9);  // spans tokens
  for (const stream of [false, true]) {
    const r = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 60, temperature: 0, stop: [stop, 'zzz'], stream });
    let text = '';
    let finish = null;
    if (stream) {
      for await (const chunk of r) {
        text += chunk.choices[0]?.text ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } else {
      text = r.choices[0].text;
      finish = r.choices[0].finish_reason;
    }
    assert.equal(text, full.slice(0, full.indexOf(stop)), `stream=${stream}`);
    assert.equal(finish, 'stop');
  }
});

test('a second turn is served from the prefix cache', async () => {
  const messages = [{ role: 'user', content: 'Tell me about a big red ball and a small blue car that went to the park together.' }];
  const first = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 40, temperature: 0 });
  const second = await client.chat.completions.create({
    model: 'stories260K',
    messages: [...messages, { role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: 'And then?' }],
    max_tokens: 5,
    temperature: 0,
  });
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 64, `cached_tokens ${cached} of ${second.usage.prompt_tokens}`);
  assert.ok(cached < second.usage.prompt_tokens);
});

test('a second turn reuses the whole answer, even one its text would tokenize differently', async () => {
  // Sampled answers are often spelled with other ids than the tokenizer would pick for their text;
  // the server puts the generated ids back (answer_cache.h), so the cache covers the whole answer.
  for (const seed of [1, 2, 3]) {
    const messages = [{ role: 'user', content: `A story about a frog, number ${seed}.` }];
    const first = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 40, temperature: 1.5, seed });
    if (first.choices[0].finish_reason !== 'length' || first.choices[0].message.content.includes('\ufffd')) continue;
    const second = await client.chat.completions.create({
      model: 'stories260K',
      messages: [...messages, { role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: 'More.' }],
      max_tokens: 3,
      temperature: 0,
    });
    // Every position the first turn computed: its prompt and all but the last generated token.
    const computed = first.usage.prompt_tokens + first.usage.completion_tokens - 1;
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= computed,
      `seed ${seed}: cached ${second.usage.prompt_tokens_details.cached_tokens} of ${second.usage.prompt_tokens}, first turn computed ${computed}`);
  }
});

test('logprobs, seed and sampling parameters', async () => {
  const r = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.logprob <= 0);
    assert.equal(t.token, t.top_logprobs[0].token);  // greedy takes the most likely token
  }
  const a = await client.completions.create({ model: 'stories260K', prompt: 'A', max_tokens: 20, temperature: 1.0, top_p: 0.9, top_k: 40, seed: 7 });
  const b = await client.completions.create({ model: 'stories260K', prompt: 'A', max_tokens: 20, temperature: 1.0, top_p: 0.9, top_k: 40, seed: 7 });
  assert.equal(a.choices[0].text, b.choices[0].text, 'the same seed gives the same sample');
});

test('errors: status codes and OpenAI error bodies', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }), (e) => e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'x' }], n: 200 }), (e) => e.status === 400 && e.param === 'n');
  await assert.rejects(client.completions.create({ model: 'stories260K', prompt: 'x', max_tokens: 5000 }), (e) => e.status === 400 && /2048/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'stories260K', messages: [{ role: 'wizard', content: 'x' }] }), (e) => e.status === 400);
  const raw = async (body, headers = {}) => fetch(`${server.baseURL}/v1/chat/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json', ...headers } });
  for (const body of ['{"messages": [', '[]', '{"messages": "hi"}', '{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}', '{"messages": [{"role": "user", "content": "x"}], "temperature": 9}']) {
    const r = await raw(body);
    assert.equal(r.status, 400, body);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
    assert.equal(j.error.type, 'invalid_request_error');
  }
  const big = await raw(JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(9 << 20) }] }));
  assert.equal(big.status, 413);
  assert.equal((await fetch(`${server.baseURL}/v1/nothing`)).status, 404);
  assert.equal((await fetch(`${server.baseURL}/health`)).status, 200, 'still healthy');
});

test('a client that disconnects mid-stream cancels its request and frees its KV blocks', async () => {
  const controller = new AbortController();
  const r = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1500, ignore_eos: true, temperature: 0, stream: true }),
    signal: controller.signal,
  });
  const reader = r.body.getReader();
  await reader.read();
  controller.abort();
  await waitFor(async () => {
    const m = await metrics(server.baseURL);
    return m.value('promptly:num_requests_running') === 0 && m.value('promptly:kv_cache_usage_perc') === 0 &&
      m.value('promptly:request_success_total{finished_reason="cancelled"}') >= 1;
  }, 'the cancelled request to release everything');
  const m = await metrics(server.baseURL);
  for (const name of ['time_to_first_token_seconds', 'inter_token_latency_seconds', 'e2e_request_latency_seconds', 'request_queue_time_seconds', 'request_prefill_time_seconds']) {
    assert.match(m.text, new RegExp(`^promptly:${name}_count \\d+$`, 'm'));
  }
  for (const name of ['num_requests_waiting', 'prompt_tokens_total', 'generation_tokens_total', 'prefix_cache_queries_total', 'prefix_cache_hits_total', 'num_preemptions_total', 'engine_steps_interrupted_total']) {
    assert.ok(Number.isFinite(m.value(`promptly:${name}`)), name);
  }
});

test('a client that disconnects while waiting for a non-streaming answer cancels it too', async () => {
  const before = (await metrics(server.baseURL)).value('promptly:request_success_total{finished_reason="cancelled"}');
  const controller = new AbortController();
  const pending = fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, ignore_eos: true, temperature: 0 }),
    signal: controller.signal,
  }).catch((e) => e);
  await waitFor(async () => (await metrics(server.baseURL)).value('promptly:num_requests_running') === 1, 'the request to start');
  controller.abort();
  assert.equal((await pending).name, 'AbortError');
  await waitFor(async () => {
    const m = await metrics(server.baseURL);
    return m.value('promptly:num_requests_running') === 0 && m.value('promptly:kv_cache_usage_perc') === 0 &&
      m.value('promptly:request_success_total{finished_reason="cancelled"}') === before + 1;
  }, 'the cancelled request to release everything');
});

test('API key, queue limit and shutdown statuses', async () => {
  const guarded = await startServer(['-m', STORIES, '--api-key', 'sekret', '--max-queue', '0', '--alias', 'tiny']);
  try {
    const bad = new OpenAI({ baseURL: `${guarded.baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const good = new OpenAI({ baseURL: `${guarded.baseURL}/v1`, apiKey: 'sekret', maxRetries: 0 });
    assert.equal((await good.models.list()).data[0].id, 'tiny');
    // --max-queue 0: nothing may wait, so a request arriving while the queue is "full" gets 429.
    const r = await fetch(`${guarded.baseURL}/v1/completions`, { method: 'POST', headers: { authorization: 'Bearer sekret' }, body: '{"prompt": "x"}' });
    assert.equal(r.status, 429);
    assert.equal(r.headers.get('retry-after'), '1');
  } finally {
    await guarded.stop();
  }
  // On SIGTERM: in-flight streams finish (or are cancelled after the grace), new requests get 503.
  const s = await startServer(['-m', STORIES, '--shutdown-grace', '0.5']);
  const long = fetch(`${s.baseURL}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'A', max_tokens: 1900, ignore_eos: true, stream: true }) });
  const res = await long;
  const reader = res.body.getReader();
  await reader.read();
  // A keep-alive connection opened before the signal: its next request is answered 503.
  const idle = net.connect(s.port, '127.0.0.1');
  // The server may reset this connection once it has answered and is closing down (how fast depends
  // on the machine's load): only the answer matters here, so a reset must not crash the test.
  let idleError = null;
  idle.on('error', (e) => {
    idleError = e;
  });
  await new Promise((r) => idle.on('connect', r));
  s.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  const answer = new Promise((resolve) => {
    let text = '';
    idle.on('data', (d) => {
      text += d.toString();
      if (text.includes('\r\n\r\n')) resolve(text);
    });
    idle.on('close', () => resolve(`${text} (closed${idleError ? `: ${idleError.code}` : ''})`));
  });
  idle.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"prompt": "x"}');
  assert.match(await answer, /^HTTP\/1\.1 503 /);
  idle.destroy();
  let rest = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    rest += new TextDecoder().decode(value);
  }
  assert.match(rest, /"finish_reason":"(cancelled|length)"/);
  assert.match(rest, /data: \[DONE\]/);
  const code = await new Promise((resolve) => (s.proc.exitCode !== null ? resolve(s.proc.exitCode) : s.proc.on('exit', resolve)));
  assert.equal(code, 0);
});

test('a generated model carrying a real chat template', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-e2e-'));
  const template = path.join(SHARED, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja');
  const model = path.join(dir, 'qwen-tiny.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', 'tiny-qwen2', '--chat-template', template, '-o', model], { stdio: 'ignore' });
  const s = await startServer(['-m', model]);
  try {
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }];
    const r = await c.chat.completions.create({ model: 'qwen-tiny', messages, max_tokens: 4, temperature: 0 });
    // The prompt is the template's rendering, tokenized with special tokens parsed (and BOS as the
    // vocabulary asks, unless the template wrote it).
    const msgFile = path.join(dir, 'messages.json');
    writeFileSync(msgFile, JSON.stringify(messages));
    const rendered = execFileSync(BINARY, ['template', '-m', model, '--messages', msgFile, '--add-generation-prompt']).toString();
    const ids = JSON.parse(execFileSync(BINARY, ['tokenize', '-m', model, '--special', rendered]).toString());
    assert.equal(r.usage.prompt_tokens, ids.length);
    assert.equal(r.usage.completion_tokens, 4);
  } finally {
    await s.stop();
  }
});

test('serve without -m answers with the built-in code model at once', async () => {
  const s = await startServer([]);
  try {
    const models = await (await fetch(`${s.baseURL}/v1/models`)).json();
    assert.equal(models.data[0].id, 'promptly-code-23m');
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const r = await c.completions.create({ model: 'promptly-code-23m', prompt: 'def fibonacci(n):', max_tokens: 32, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 32);
    assert.match(r.choices[0].text, /^\n    /);
    assert.equal(r.choices[0].text, runGreedy('promptly-code-23m', 'def fibonacci(n):', 32).text);
  } finally {
    await s.stop();
  }
});

test('serve --draft speculates: the same greedy text, the spec_decode metrics, and an opt-out', async () => {
  const target = path.join(SHARED, 'code', 'code-target-f16.gguf');
  const s = await startServer(['-m', target, '--draft', path.join(SHARED, 'code', 'code-draft-f16.gguf'), '--kv-type', 'f32', '-t', '2']);
  try {
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const prompt = 'import os\n\n\ndef list_python_files(root):\n    """Return the paths of the Python files under root."""\n';
    const expected = runGreedy(target, prompt, 48).text;
    const r = await c.completions.create({ model: 'code-target-f16', prompt, max_tokens: 48, temperature: 0 });
    assert.equal(r.choices[0].text, expected);
    const m = await metrics(s.baseURL);
    const drafted = m.value('promptly:spec_decode_num_draft_tokens_total');
    assert.ok(drafted > 0, `draft tokens ${drafted}`);
    assert.ok(m.value('promptly:spec_decode_num_accepted_tokens_total') > 0);
    assert.ok(m.value('promptly:spec_decode_num_accepted_tokens_per_pos_total{position="0"}') > 0);
    const off = await c.completions.create({ model: 'code-target-f16', prompt, max_tokens: 48, temperature: 0, speculative: false });
    assert.equal(off.choices[0].text, expected);
    assert.equal((await metrics(s.baseURL)).value('promptly:spec_decode_num_draft_tokens_total'), drafted);
  } finally {
    await s.stop();
  }
});

// What reaches the model and what the API accepts (a random-weight model writes no calls; the next
// test gets calls from the code model, and tests/chat/tool_calls_test.cpp parses real templates' own).
test('tools: offered through the template, a round trip accepted, streaming equal to non-streaming, bad tools are 400s', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-e2e-'));
  const model = path.join(dir, 'qwen-tools.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', 'tiny-qwen2', '--chat-template', path.join(SHARED, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja'), '-o', model], { stdio: 'ignore' });
  const hermes = path.join(dir, 'hermes-tools.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', 'tiny-qwen2', '--chat-template', path.join(SHARED, 'templates', 'NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja'), '-o', hermes], { stdio: 'ignore' });
  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
    { type: 'function', function: { name: 'get_time', description: 'Time in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  ];
  const roundTrip = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_abc', content: '{"temperature_c": 18}' },
    { role: 'assistant', content: 'It is 18 C.' },
    { role: 'user', content: 'And the time?' },
  ];
  const s = await startServer(['-m', model]);
  try {
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const ask = (extra) => c.chat.completions.create({ model: 'qwen-tools', messages: roundTrip, max_tokens: 12, temperature: 0, ...extra });
    const plain = await ask({});
    const offered = await ask({ tools });
    // The tools are described in the prompt, and tool_choice "none" keeps them out of it.
    assert.ok(offered.usage.prompt_tokens > plain.usage.prompt_tokens + 50, `${offered.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
    assert.equal((await ask({ tools, tool_choice: 'none' })).usage.prompt_tokens, plain.usage.prompt_tokens);
    assert.equal(offered.choices[0].message.role, 'assistant');
    assert.equal(typeof offered.choices[0].message.content, 'string');
    assert.equal(offered.choices[0].message.tool_calls, undefined);
    assert.ok(['stop', 'length'].includes(offered.choices[0].finish_reason));
    // (tool_choice "required" and a named function constrain the output: structured.test.mjs.)
    const auto = await ask({ tools, tool_choice: 'auto', parallel_tool_calls: false });
    assert.equal(auto.usage.prompt_tokens, offered.usage.prompt_tokens);
    assert.equal(auto.choices[0].message.content, offered.choices[0].message.content);
    // Streaming with tools goes through the incremental parser: the same text, the same ending.
    const stream = await ask({ tools, stream: true, logprobs: true });
    let text = '';
    let finish = null;
    let logprobs = 0;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      assert.equal(choice.delta.tool_calls, undefined);
      text += choice.delta.content ?? '';
      logprobs += choice.logprobs?.content?.length ?? 0;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assert.equal(text, offered.choices[0].message.content);
    assert.equal(finish, offered.choices[0].finish_reason);
    assert.equal(logprobs, offered.usage.completion_tokens);

    const rejects = (body, param) => assert.rejects(c.chat.completions.create({ model: 'qwen-tools', messages: roundTrip, max_tokens: 2, ...body }), (e) => e.status === 400 && e.param === param);
    await rejects({ tools: [{ type: 'function', function: { description: 'no name' } }] }, 'tools');
    await rejects({ tools: [{ type: 'code_interpreter' }] }, 'tools');
    await rejects({ tools, tool_choice: { type: 'function', function: { name: 'launch_rocket' } } }, 'tool_choice');
    await rejects({ tools, tool_choice: 'always' }, 'tool_choice');
    await rejects({ tool_choice: 'required' }, 'tool_choice');
    await rejects({ tools, parallel_tool_calls: 'no' }, 'parallel_tool_calls');
    await assert.rejects(c.chat.completions.create({ model: 'qwen-tools', max_tokens: 2, messages: [{ role: 'user', content: 'x' }, { role: 'tool', content: 'orphan' }] }),
      (e) => e.status === 400 && e.param === 'messages[1].tool_call_id');
  } finally {
    await s.stop();
  }
  // Hermes-3's tool_use template loops over tools unguarded: without tools it must still render.
  const h = await startServer(['-m', hermes]);
  try {
    const c = new OpenAI({ baseURL: `${h.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const without = await c.chat.completions.create({ model: 'hermes-tools', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0 });
    assert.equal(without.usage.completion_tokens, 2);
    const withTools = await c.chat.completions.create({ model: 'hermes-tools', messages: roundTrip, tools, max_tokens: 2, temperature: 0 });
    assert.ok(withTools.usage.prompt_tokens > without.usage.prompt_tokens);
  } finally {
    await h.stop();
  }
});

// Calls parsed out of generated text: with a test template whose prompt is the user's text as
// written, the built-in code model (greedy) goes on repeating the calls the prompt lists. The
// template's markers pick the format: Hermes (<tool_call>) or Llama 3 JSON (<|start_header_id|>).
test('tool calls the model writes come back as tool_calls, streamed as OpenAI does', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-e2e-'));
  const echo = '{%- for message in messages %}{{ message["content"] }}{%- endfor %}';
  const hermesTemplate = path.join(dir, 'hermes-echo.jinja');
  writeFileSync(hermesTemplate, `{#- Test template: tool calls in the Hermes form (<tool_call>). -#}\n${echo}`);
  const llamaTemplate = path.join(dir, 'llama-echo.jinja');
  writeFileSync(llamaTemplate, `{#- Test template: tool calls in the Llama 3 JSON form (<|start_header_id|>, tool_calls). -#}\n${echo}`);
  const tools = [{ type: 'function', function: { name: 'get_time', description: 'Time in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const cities = ['Oslo', 'Rome', 'Lima', 'Oslo', 'Rome'];
  const collect = async (stream) => {
    const out = { content: '', calls: [], finish: null, chunks: [] };
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      out.chunks.push(choice.delta);
      out.content += choice.delta.content ?? '';
      for (const d of choice.delta.tool_calls ?? []) {
        if (d.id) {
          assert.equal(d.index, out.calls.length);
          assert.equal(d.type, 'function');
          assert.equal(d.function.arguments, '');
          out.calls.push({ id: d.id, type: 'function', function: { name: d.function.name, arguments: '' } });
        } else {
          out.calls[d.index].function.arguments += d.function.arguments;
        }
      }
      if (choice.finish_reason) out.finish = choice.finish_reason;
    }
    return out;
  };
  const sameCalls = (a, b) => assert.deepEqual(a.map((c) => c.function), b.map((c) => c.function));

  let s = await startServer(['--chat-template', hermesTemplate]);
  try {
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const prompt = 'CALLS = """\n' + cities.map((city) => `<tool_call>{"name": "get_time", "arguments": {"city": "${city}"}}</tool_call>\n`).join('');
    const body = { model: 'promptly-code-23m', messages: [{ role: 'user', content: prompt }], tools, max_tokens: 70, temperature: 0 };
    const r = await c.chat.completions.create(body);
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls.length >= 2, JSON.stringify(r.choices[0]));
    for (const call of calls) {
      assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(call.function.name, 'get_time');
      assert.ok(cities.includes(JSON.parse(call.function.arguments).city));
    }
    // max_tokens stopped it inside the next call: that part is content, and the reason is length.
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok('<tool_call>'.startsWith(r.choices[0].message.content ?? '') || r.choices[0].message.content.startsWith('<tool_call>'));
    const streamed = await collect(await c.chat.completions.create({ ...body, stream: true }));
    assert.equal(streamed.chunks[0].role, 'assistant');
    sameCalls(streamed.calls, calls);
    assert.equal(streamed.content, r.choices[0].message.content ?? '');
    assert.equal(streamed.finish, 'length');
    // parallel_tool_calls false: the first call only; the next ones stay text.
    const single = await c.chat.completions.create({ ...body, parallel_tool_calls: false });
    assert.equal(single.choices[0].message.tool_calls.length, 1);
    assert.deepEqual(single.choices[0].message.tool_calls[0].function, calls[0].function);
    assert.ok(single.choices[0].message.content.startsWith('<tool_call>{"name": "get_time"'));
    // tool_choice "none": nothing is parsed.
    const none = await c.chat.completions.create({ ...body, tool_choice: 'none' });
    assert.equal(none.choices[0].message.tool_calls, undefined);
    assert.ok(none.choices[0].message.content.startsWith('<tool_call>'));
  } finally {
    await s.stop();
  }

  s = await startServer(['--chat-template', llamaTemplate]);
  try {
    const c = new OpenAI({ baseURL: `${s.baseURL}/v1`, apiKey: 'x', maxRetries: 0 });
    const prompt = 'CALLS = [\n' + cities.map((city) => `    {"name": "get_time", "parameters": {"city": "${city}"}},\n`).join('') + '    ';
    const body = { model: 'promptly-code-23m', messages: [{ role: 'user', content: prompt }], tools, max_tokens: 60, temperature: 0 };
    // The stop string ends the answer right after one object: the whole answer is a call.
    const r = await c.chat.completions.create({ ...body, stop: [',\n'] });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(r.choices[0].message.content, null);
    assert.equal(r.choices[0].message.tool_calls.length, 1);
    assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_time');
    const streamed = await collect(await c.chat.completions.create({ ...body, stop: [',\n'], stream: true }));
    assert.equal(streamed.finish, 'tool_calls');
    assert.equal(streamed.content, '');
    sameCalls(streamed.calls, r.choices[0].message.tool_calls);
    assert.deepEqual(Object.keys(streamed.chunks[0]).sort(), ['content', 'role', 'tool_calls']);
    // Without it the answer goes on past the object: not a call, so all of it is content.
    const text = await c.chat.completions.create(body);
    assert.equal(text.choices[0].message.tool_calls, undefined);
    assert.ok(text.choices[0].message.content.startsWith('{"name": "get_time", "parameters": {"city": '));
    assert.equal(text.choices[0].finish_reason, 'length');
  } finally {
    await s.stop();
  }
});
