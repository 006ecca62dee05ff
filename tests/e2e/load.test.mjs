// A bounded load test on loopback: 64 concurrent streaming clients, a quarter of them hanging up
// mid-stream, plus malformed requests. Every completed stream must carry exactly its prompt's greedy
// text, the server must stay healthy, release every KV block, and return to its idle memory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { STORIES, startServer, metrics, waitFor, rssKb } from './helpers.mjs';

const PROMPTS = ['Once upon a time', 'The big dog', 'Lily and Ben', 'One day, a bird', 'The sun was', 'Tom had a red', 'She found a', 'In the park'];

async function complete(baseURL, prompt, { stream, abortAfter } = {}) {
  const controller = new AbortController();
  const r = await fetch(`${baseURL}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 48, temperature: 0, stream }),
    signal: controller.signal,
  });
  assert.equal(r.status, 200);
  if (!stream) return (await r.json()).choices[0].text;
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let text = '';
  let events = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (line === 'data: [DONE]') return text;
      const chunk = JSON.parse(line.slice('data: '.length));
      text += chunk.choices[0]?.text ?? '';
      if (abortAfter !== undefined && ++events >= abortAfter) {
        controller.abort();
        return null;
      }
    }
  }
  throw new Error('stream ended without [DONE]');
}

test('64 concurrent streams with disconnects and malformed requests', { timeout: 240000 }, async () => {
  const server = await startServer(['-m', STORIES, '-t', '2']);
  try {
    const expected = {};
    for (const p of PROMPTS) expected[p] = await complete(server.baseURL, p, { stream: false });
    const idleRss = rssKb(server.proc.pid);

    const clients = [];
    for (let i = 0; i < 64; ++i) {
      const prompt = PROMPTS[i % PROMPTS.length];
      const abortAfter = i % 4 === 3 ? 1 + (i % 7) : undefined;
      clients.push(complete(server.baseURL, prompt, { stream: true, abortAfter }).then((text) => ({ prompt, text, abortAfter })).catch((e) => {
        if (abortAfter !== undefined && e.name === 'AbortError') return { prompt, text: null, abortAfter };
        throw e;
      }));
    }
    const malformed = ['{', '{"prompt": 5}', '{"prompt": "x", "max_tokens": -1}', 'null'].map((body) =>
      fetch(`${server.baseURL}/v1/completions`, { method: 'POST', body }).then((r) => r.status));
    const results = await Promise.all(clients);
    assert.deepEqual(await Promise.all(malformed), [400, 400, 400, 400]);
    let completed = 0;
    for (const r of results) {
      if (r.abortAfter !== undefined) continue;
      assert.equal(r.text, expected[r.prompt], `greedy output of '${r.prompt}' under load`);
      ++completed;
    }
    assert.equal(completed, 48);

    await waitFor(async () => {
      const m = await metrics(server.baseURL);
      return m.value('promptly:num_requests_running') === 0 && m.value('promptly:num_requests_waiting') === 0 &&
        m.value('promptly:kv_cache_usage_perc') === 0;
    }, 'the server to go idle', 30000);
    assert.equal((await fetch(`${server.baseURL}/health`)).status, 200);
    // One more round after the load: still correct.
    assert.equal(await complete(server.baseURL, PROMPTS[0], { stream: true }), expected[PROMPTS[0]]);
    const afterRss = rssKb(server.proc.pid);
    assert.ok(afterRss - idleRss < 64 * 1024, `resident memory grew from ${idleRss} kB to ${afterRss} kB`);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});
