// `promptly bench serve` against a running `promptly serve` (stories260K): the counts and token
// totals it reports must match what the server itself counted, multi-turn conversations must
// resend the server's answers, and failures (nothing listening, 404s) are counted with exit 2.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BINARY, STORIES, startServer, metrics } from './helpers.mjs';

let server;
let dir;

before(async () => {
  server = await startServer(['-m', STORIES, '--alias', 'stories']);
  dir = mkdtempSync(path.join(tmpdir(), 'bench-serve-'));
});

after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

function bench(args) {
  return new Promise((resolve) => {
    execFile(BINARY, ['bench', 'serve', ...args], { timeout: 120000 }, (error, stdout, stderr) => {
      resolve({ code: error ? error.code : 0, stdout, stderr });
    });
  });
}

const SMALL = ['--input-len', '20', '--output-len', '16', '--ignore-eos'];

test('random dataset: every request completes and the totals match the server\'s own counts', async () => {
  const before = await metrics(server.baseURL);
  const out = path.join(dir, 'random.json');
  const r = await bench(['--url', server.baseURL, '--dataset', 'random', '--num-prompts', '8', '--request-rate', 'inf', ...SMALL,
    '--slo-ttft-ms', '600000', '--json', out]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /8 completed, 0 failed/);
  assert.match(r.stdout, /\| TTFT \|/);
  assert.match(r.stderr, /model stories/);
  const j = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(j.model, 'stories');
  assert.equal(j.completed, 8);
  assert.equal(j.failed, 0);
  assert.equal(j.total_output_tokens, 8 * 16);
  assert.deepEqual(j.output_lens, Array(8).fill(16));
  assert.ok(j.input_lens.every((n) => n > 20), `input_lens ${j.input_lens}`);
  assert.equal(j.input_lens.reduce((a, b) => a + b, 0), j.total_input_tokens);
  const after = await metrics(server.baseURL);
  assert.equal(after.value('promptly:generation_tokens_total') - before.value('promptly:generation_tokens_total'), j.total_output_tokens);
  assert.equal(after.value('promptly:prompt_tokens_total') - before.value('promptly:prompt_tokens_total'), j.total_input_tokens);
  for (const m of ['ttft', 'tpot', 'itl', 'e2el']) {
    assert.ok(j[`mean_${m}_ms`] > 0, m);
    assert.ok(j[`median_${m}_ms`] <= j[`p99_${m}_ms`] + 1e-9, m);
  }
  assert.ok(j.mean_e2el_ms > j.mean_ttft_ms);
  assert.ok(j.itls.every((gaps) => gaps.length >= 1 && gaps.length <= 15));
  assert.ok(Math.abs(j.request_throughput - 8 / j.duration) < 1e-9);
  assert.ok(Math.abs(j.request_goodput - j.request_throughput) < 1e-9, 'every request meets a 600 s TTFT SLO');
});

test('multiturn: each turn resends the history with the server\'s answers', async () => {
  const out = path.join(dir, 'multiturn.json');
  const r = await bench(['--url', server.baseURL, '--dataset', 'multiturn', '--num-prompts', '1', '--turns', '3', '--think-ms', '5',
    '--input-len', '8', '--output-len', '12', '--ignore-eos', '--json', out]);
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(j.completed, 3);
  // One conversation runs turn after turn, so the records are in turn order: each prompt holds the
  // previous prompt and its answer.
  for (let t = 1; t < 3; t++) assert.ok(j.input_lens[t] >= j.input_lens[t - 1] + j.output_lens[t - 1], `input_lens ${j.input_lens}`);
});

test('ShareGPT conversations over the completions API: max_tokens from the reference answers', async () => {
  const data = path.join(dir, 'chats.jsonl');
  writeFileSync(data, [
    { conversations: [{ from: 'human', value: 'Tell me a story' }, { from: 'gpt', value: 'Once upon a time there was a cat.' },
      { from: 'human', value: 'And then?' }, { from: 'gpt', value: 'The end.' }] },
    { messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello, how can I help you today?' }] },
  ].map((c) => JSON.stringify(c)).join('\n') + '\n');
  const out = path.join(dir, 'chats.json');
  const r = await bench(['--url', `${server.baseURL}/v1`, '--api', 'completions', '--dataset', data, '--think-ms', '0', '--ignore-eos', '--json', out]);
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(j.completed, 3);
  // 34, 8 and 32 bytes of reference answer at about 4 bytes a token.
  assert.deepEqual([...j.output_lens].sort((a, b) => a - b), [2, 8, 9]);
});

test('a request-rate sweep reports each rate and plots TTFT and ITL against the rate', async () => {
  const out = path.join(dir, 'sweep.json');
  const svg = path.join(dir, 'sweep.svg');
  const r = await bench(['--url', server.baseURL, '--num-prompts', '3', '--request-rate', '20,40', ...SMALL, '--json', out, '--plot', svg]);
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(readFileSync(out, 'utf8'));
  assert.deepEqual(j.sweep.map((run) => run.request_rate), [20, 40]);
  assert.deepEqual(j.sweep.map((run) => run.completed), [3, 3]);
  const plot = readFileSync(svg, 'utf8');
  assert.equal(plot.match(/<polyline/g).length, 3);
  for (const label of ['TTFT p50', 'TTFT p99', 'ITL p99']) assert.ok(plot.includes(label), label);
});

test('nothing listening: every request is counted as failed, exit status 2', async () => {
  const port = await new Promise((resolve) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
  const out = path.join(dir, 'refused.json');
  const r = await bench(['--url', `http://127.0.0.1:${port}`, '--num-prompts', '5', ...SMALL, '--json', out]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stdout, /0 completed, 5 failed/);
  assert.match(r.stderr, /failed x5: connect: Connection refused/);
  const j = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(j.completed, 0);
  assert.equal(j.failed, 5);
  assert.equal(j.mean_ttft_ms, 0);
});

test('an unknown model is answered 404 and reported; a malformed URL is a usage error', async () => {
  const r = await bench(['--url', server.baseURL, '--model', 'no-such-model', '--num-prompts', '2', ...SMALL]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /failed x2: HTTP 404/);
  const bad = await bench(['--url', 'localhost:8080', '--num-prompts', '1']);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /expected http:\/\/HOST\[:PORT\]/);
  const file = await bench(['--url', server.baseURL, '--dataset', path.join(dir, 'missing.jsonl')]);
  assert.equal(file.code, 1);
  assert.match(file.stderr, /missing\.jsonl/);
});
