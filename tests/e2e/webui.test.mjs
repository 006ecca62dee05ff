// The web UI at / : its HTTP caching (ETag, 304, gzip), --no-webui, the utilisation metrics it
// shows, and the page itself driven in Debian's chromium (headless, through puppeteer-core):
// send a message and watch it stream, Stop a long reply and see the server count it cancelled,
// reload and find the conversation. A screenshot is left at build/webui-screenshot.png.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import puppeteer from 'puppeteer-core';
import { startServer, metrics, waitFor } from './helpers.mjs';

const SCREENSHOT = process.env.PROMPTLY_WEBUI_SCREENSHOT ?? path.resolve('build/webui-screenshot.png');
// The sanitized debug server generates several times slower: every wait is generous.
const SLOW = 120000;

function findChromium() {
  if (process.env.PROMPTLY_CHROMIUM) return process.env.PROMPTLY_CHROMIUM;
  for (const name of ['chromium', 'chromium-browser', 'google-chrome']) {
    try {
      return execFileSync('which', [name], { encoding: 'utf8' }).trim();
    } catch {
      // try the next name
    }
  }
  throw new Error("no chromium: install Debian's chromium (tools/install-deps.sh does) or set PROMPTLY_CHROMIUM");
}

// A raw GET (fetch would add its own Accept-Encoding and decompress behind our back).
function get(url, headers = {}, method = 'GET') {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end();
  });
}

let server;
before(async () => {
  // The built-in model on one thread; without speculation, so that a long reply streams slowly
  // enough to be stopped halfway (greedy, it repeats one line and would be guessed ahead).
  server = await startServer(['--spec', 'none']);
});
after(async () => {
  assert.equal(await server.stop(), 0, server.log());
});

test('GET / serves the page with validators, gzip to those who accept it, and 304 when unchanged', async () => {
  const plain = await get(`${server.baseURL}/`);
  assert.equal(plain.status, 200);
  assert.match(plain.headers['content-type'], /^text\/html/);
  assert.equal(plain.headers['content-encoding'], undefined);
  assert.equal(plain.headers['cache-control'], 'no-cache');
  assert.equal(plain.headers.vary, 'Accept-Encoding');
  assert.match(plain.headers.etag, /^"[0-9a-f]{16}"$/);
  const html = plain.body.toString('utf8');
  assert.match(html, /^<!doctype html>/);
  assert.ok(html.includes('/v1/chat/completions'));
  // Self-contained: no script or stylesheet fetched from anywhere (no CDN).
  assert.ok(!/<script[^>]*\ssrc=|<link[^>]*stylesheet/i.test(html), 'the page must inline its scripts and styles');

  const zipped = await get(`${server.baseURL}/`, { 'Accept-Encoding': 'gzip, deflate, br' });
  assert.equal(zipped.status, 200);
  assert.equal(zipped.headers['content-encoding'], 'gzip');
  assert.notEqual(zipped.headers.etag, plain.headers.etag);
  assert.ok(zipped.body.length < plain.body.length / 2);
  assert.equal(gunzipSync(zipped.body).toString('utf8'), html);

  const again = await get(`${server.baseURL}/`, { 'Accept-Encoding': 'gzip', 'If-None-Match': zipped.headers.etag });
  assert.equal(again.status, 304);
  assert.equal(again.body.length, 0);
  assert.equal(again.headers.etag, zipped.headers.etag);
  const stale = await get(`${server.baseURL}/`, { 'Accept-Encoding': 'gzip', 'If-None-Match': '"0000000000000000"' });
  assert.equal(stale.status, 200);

  const head = await get(`${server.baseURL}/index.html`, {}, 'HEAD');
  assert.equal(head.status, 200);
  assert.equal(Number(head.headers['content-length']), plain.body.length);
  assert.equal(head.body.length, 0);
  assert.equal((await get(`${server.baseURL}/`, {}, 'DELETE')).status, 405);
  assert.equal((await get(`${server.baseURL}/nothing-here`)).status, 404);
});

test('--no-webui answers 404 at /', async () => {
  const bare = await startServer(['--no-webui']);
  try {
    assert.equal((await get(`${bare.baseURL}/`)).status, 404);
    assert.equal((await get(`${bare.baseURL}/health`)).status, 200);
  } finally {
    assert.equal(await bare.stop(), 0, bare.log());
  }
});

test('/metrics reports utilisation: busy ratio, compute threads, process CPU and memory', async () => {
  const m = await metrics(server.baseURL);
  const busy = m.value('promptly:engine_busy_ratio');
  assert.ok(busy >= 0 && busy <= 1, `engine_busy_ratio ${busy}`);
  assert.equal(m.value('promptly:cpu_threads'), 1);
  assert.ok(m.value('promptly:engine_busy_seconds_total') >= 0);
  assert.ok(m.value('process_cpu_seconds_total') > 0);
  assert.ok(m.value('process_resident_memory_bytes') > 10e6);
  assert.match(m.text, /^# TYPE process_cpu_seconds_total counter$/m);
  assert.match(m.text, /^# TYPE promptly:engine_busy_ratio gauge$/m);
});

async function withPage(fn) {
  const browser = await puppeteer.launch({
    executablePath: findChromium(),
    headless: true,
    // CI runs as root, where Chromium's sandbox cannot start.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1200, height: 800 });
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));
    await page.goto(`${server.baseURL}/`, { waitUntil: 'load' });
    await fn(page);
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
  }
}

test('replies render as Markdown with highlighted code and copy buttons, never as live HTML; edit, regenerate, new chat, theme', { timeout: 5 * SLOW }, async () => {
  await withPage(async (page) => {
    // A stored conversation (as a previous session would have left it) with hostile Markdown.
    const reply = [
      '# Title',
      'Some **bold** text and a [good link](https://example.com) and a [bad one](javascript:alert(1)).',
      '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>',
      '```python',
      'def add(a, b):',
      '    return a + b',
      '```',
    ].join('\n');
    await page.evaluate((content) => {
      localStorage.setItem('promptly.conversations', JSON.stringify([
        { id: 'stored', title: 'Stored chat', updated: Date.now(), messages: [{ role: 'user', content: 'Add two numbers' }, { role: 'assistant', content, stats: { ttft_ms: 12, tokens: 30, tokens_per_s: 99.5, finish_reason: 'stop' } }] },
      ]));
      localStorage.setItem('promptly.settings', JSON.stringify({ temperature: 0, max_tokens: 16 }));
    }, reply);
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector('.message.assistant pre code');
    const rendered = await page.$eval('.message.assistant .content', (el) => ({
      heading: el.querySelector('h1')?.textContent,
      bold: el.querySelector('strong')?.textContent,
      links: [...el.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      keywords: [...el.querySelectorAll('pre code .hljs-keyword')].map((k) => k.textContent),
      copyButtons: el.querySelectorAll('pre .copy').length,
      liveElements: el.querySelectorAll('script, img').length,
      text: el.textContent,
    }));
    assert.equal(rendered.heading, 'Title');
    assert.equal(rendered.bold, 'bold');
    assert.deepEqual(rendered.links, ['https://example.com']);
    assert.ok(rendered.keywords.includes('def') && rendered.keywords.includes('return'), JSON.stringify(rendered.keywords));
    assert.equal(rendered.copyButtons, 1);
    assert.equal(rendered.liveElements, 0);
    assert.ok(rendered.text.includes('<script>'), 'raw HTML shows as text');
    assert.equal(await page.evaluate(() => window.pwned), undefined);
    assert.match(await page.$eval('.message.assistant .stats', (el) => el.textContent), /TTFT 12 ms · 30 tokens · 99\.5 tokens\/s/);

    // Edit the question and resend: the old answer goes, a new one streams in its place.
    await page.click('.message.user .edit');
    await page.$eval('.message.user textarea', (el) => {
      el.value = 'Multiply two numbers';
    });
    await page.click('.message.user .resend');
    await page.waitForSelector('#send', { visible: true, timeout: SLOW });
    const afterEdit = await page.$$eval('.message', (els) => els.map((el) => [el.classList[1], el.querySelector('.content')?.textContent ?? '']));
    assert.equal(afterEdit.length, 2);
    assert.deepEqual(afterEdit[0], ['user', 'Multiply two numbers']);
    assert.ok(!afterEdit[1][1].includes('Title'), 'the old answer is gone');
    assert.match(await page.$eval('.message.assistant .stats', (el) => el.textContent), /TTFT \d+ ms/);

    // Regenerate replaces the last answer; still two messages.
    await page.click('.message.assistant .regenerate');
    await page.waitForSelector('#send', { visible: true, timeout: SLOW });
    assert.equal(await page.$$eval('.message', (els) => els.length), 2);

    // New chat: an empty page, and a second conversation once it has a message.
    await page.click('#new-chat');
    assert.equal(await page.$$eval('.message', (els) => els.length), 0);
    await page.type('#prompt', 'Hello');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('.conversation').length === 2, { timeout: SLOW });
    await page.waitForSelector('#send', { visible: true, timeout: SLOW });

    // Theme toggles and is remembered.
    const theme = () => page.evaluate(() => document.documentElement.dataset.theme);
    const before = await theme();
    await page.click('#toggle-theme');
    const flipped = await theme();
    assert.notEqual(flipped, before);
    await page.reload({ waitUntil: 'load' });
    assert.equal(await theme(), flipped);
  });
});

test('the chat page streams a reply, stops a long one (cancelled on the server) and keeps both across a reload', { timeout: 5 * SLOW }, async () => {
  await withPage(async (page) => {
    await page.waitForFunction(() => document.getElementById('model-name').textContent !== 'Promptly', { timeout: SLOW });
    // The status panel has read /metrics.
    await page.waitForFunction(() => /^\d+$/.test(document.getElementById('status-running').textContent), { timeout: SLOW });

    const setSetting = async (id, value) => {
      await page.$eval(`#${id}`, (el, v) => {
        el.value = v;
        el.dispatchEvent(new Event('input'));
      }, String(value));
    };
    await page.click('#toggle-settings');
    await setSetting('temperature', 0);
    await setSetting('max-tokens', 48);

    // 1. A short reply streams in and finishes.
    await page.type('#prompt', 'Write a Python function that adds two numbers.');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelector('.message.assistant .content')?.textContent.trim().length > 0, { timeout: SLOW });
    await page.waitForSelector('#send', { visible: true, timeout: SLOW });
    const first = await page.$eval('.message.assistant .stats', (el) => el.textContent);
    assert.match(first, /TTFT \d+ ms/);
    assert.match(first, /\d+ tokens/);

    // 2. A long reply is stopped while it streams: the server ends it as cancelled.
    const cancelled = async () => (await metrics(server.baseURL)).value('promptly:request_success_total{finished_reason="cancelled"}');
    const cancelledBefore = await cancelled();
    await setSetting('max-tokens', 800);
    await page.type('#prompt', 'Now write a long program with many functions.');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelectorAll('.message.assistant').length === 2, { timeout: SLOW });
    const streamedLength = () => page.$eval('.message.assistant:last-child .content', (el) => el.textContent.length);
    // Text on the page while the reply is still running: it streams.
    await page.waitForFunction(
      () => document.querySelector('.message.assistant:last-child .content').textContent.length > 0 && !document.getElementById('stop').hidden,
      { timeout: SLOW },
    );
    const partial = await streamedLength();
    await page.click('#stop');
    await page.waitForSelector('#send', { visible: true, timeout: SLOW });
    await waitFor(async () => (await cancelled()) >= cancelledBefore + 1, 'the server to count a cancelled request', SLOW);
    const stopped = await page.$eval('.message.assistant:last-child .stats', (el) => el.textContent);
    assert.match(stopped, /stopped/);
    assert.ok((await streamedLength()) >= partial);

    // 3. After a reload the conversation is in the sidebar and opens with both turns.
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector('.conversation .title', { timeout: SLOW });
    const titles = await page.$$eval('.conversation .title', (els) => els.map((el) => el.textContent));
    assert.ok(titles.some((t) => t.startsWith('Write a Python function')), `sidebar: ${titles}`);
    await page.click('.conversation .title');
    const users = await page.$$eval('.message.user .content', (els) => els.map((el) => el.textContent));
    assert.deepEqual(users, ['Write a Python function that adds two numbers.', 'Now write a long program with many functions.']);
    assert.equal(await page.$$eval('.message.assistant', (els) => els.length), 2);

    mkdirSync(path.dirname(SCREENSHOT), { recursive: true });
    await page.screenshot({ path: SCREENSHOT });
  });
});
