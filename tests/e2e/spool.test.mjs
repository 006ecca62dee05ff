// The KV spool through the server: a restarted server answers a conversation it saw before from
// its spool (the same greedy text, cached_tokens > 0, the spool metrics move), and a server killed
// with SIGKILL while it serves leaves a spool the next one starts from.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, metrics, waitFor, STORIES } from './helpers.mjs';

const conversation = [
  { role: 'system', content: 'You tell short stories about a little girl named Lily and her dog. '.repeat(8) },
  { role: 'user', content: 'Tell me what Lily did in the park on a sunny day with her friends and her mom.' },
];

async function chat(baseURL) {
  const r = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'stories260K', messages: conversation, max_tokens: 24, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return r.json();
}

test('a restarted server answers from its KV spool', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'promptly-spool-'));
  try {
    let first;
    {
      const server = await startServer(['-m', STORIES, '--kv-spool', dir]);
      try {
        first = await chat(server.baseURL);
        assert.equal(first.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
      } finally {
        assert.equal(await server.stop(), 0);  // a graceful stop flushes the write queue
      }
    }
    assert.ok(readdirSync(dir).some((f) => f.endsWith('.kvb')), 'blocks were spooled');
    const server = await startServer(['-m', STORIES, '--kv-spool', dir]);
    try {
      await waitFor(() => /KV spool '.*': [1-9]\d* blocks/.test(server.log()), 'the spool line on stderr');
      const again = await chat(server.baseURL);
      assert.equal(again.choices[0].message.content, first.choices[0].message.content);
      assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(again.usage));
      const m = await metrics(server.baseURL);
      assert.ok(m.value('promptly:kv_spool_hits_total') > 0);
      assert.ok(m.value('promptly:kv_spool_blocks') > 0);
      assert.ok(m.value('promptly:kv_spool_read_seconds_count') >= 1);
      assert.equal(m.value('promptly:kv_spool_rejected_total{reason="checksum"}'), 0);
    } finally {
      await server.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a server killed mid-flight leaves a usable spool', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'promptly-spool-'));
  try {
    let reference;
    {
      const plain = await startServer(['-m', STORIES]);
      try {
        reference = await chat(plain.baseURL);
      } finally {
        await plain.stop();
      }
    }
    for (let i = 0; i < 3; i++) {
      const server = await startServer(['-m', STORIES, '--kv-spool', dir]);
      const pending = chat(server.baseURL).catch(() => null);
      await new Promise((r) => setTimeout(r, 5 + 20 * i));
      server.proc.kill('SIGKILL');
      await pending;
      await new Promise((r) => server.proc.exitCode !== null || server.proc.signalCode !== null ? r() : server.proc.on('exit', r));
    }
    const server = await startServer(['-m', STORIES, '--kv-spool', dir]);
    try {
      const answer = await chat(server.baseURL);
      assert.equal(answer.choices[0].message.content, reference.choices[0].message.content);
    } finally {
      await server.stop();
    }
    assert.ok(!readdirSync(dir).some((f) => f.startsWith('.tmp-')), 'unfinished writes were cleaned up');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
