#!/usr/bin/env node
// Multi-turn chat sessions against Promptly replicas, to measure cache affinity: each session sends
// TURNS streamed turns (a long first turn, then short follow-ups over the growing history) with
// exponential think times, and the run reports the follow-ups' prefix-cache hits (usage's
// cached_tokens) and their time to first token.
//
//   node tools/cluster-bench.mjs --url http://127.0.0.1:8080 [--key session|user|prefix|body|none]
//   node tools/cluster-bench.mjs --urls http://127.0.0.1:8081,http://127.0.0.1:8082 ...  # session i -> url i mod n
//   node tools/cluster-bench.mjs --urls R1,R2,R3 --pin http://127.0.0.1:8080 ...  # each session straight to
//     the replica the front would pick for it (r1 -> R1, ...): the same placement without the proxy
//
// --key: how a session identifies itself to the load balancer: an X-Session-Id header, the `user`
// field, the X-Promptly-Prefix-Key header sent back from the first answer, the body alone (the
// balancer computes the prefix key), or nothing. A follow-up is a hit when its cached tokens cover
// its previous turn's prompt but for the last, partly filled KV block (16 tokens).
// Other options: --sessions 24 --turns 4 --system-words 200 --first-words 100 --user-words 20
// --answer-tokens 32 --think-ms 2000 --stagger-ms 4000 --seed 1 --model M --json
import { pathToFileURL } from 'node:url';

// One streamed chat turn: status, TTFT, text, usage and the routing headers of the answer;
// onFirstToken() is called when the first token arrives.
export async function streamChat(url, body, headers = {}, { onFirstToken } = {}) {
  const start = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  const out = {
    status: r.status,
    replica: r.headers.get('x-promptly-replica'),
    prefixKey: r.headers.get('x-promptly-prefix-key'),
    ttftMs: null,
    text: '',
    tokens: 0,
    usage: null,
    finishReason: null,
    done: false,
  };
  if (r.status !== 200) {
    out.error = await r.text();
    return out;
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice('data: '.length);
      if (data === '[DONE]') {
        out.done = true;
        continue;
      }
      const chunk = JSON.parse(data);
      if (chunk.usage) out.usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      const piece = choice.delta?.content ?? '';
      if (piece.length > 0 || choice.finish_reason) {
        if (out.ttftMs === null) {
          out.ttftMs = performance.now() - start;
          onFirstToken?.();
        }
      }
      if (piece.length > 0) ++out.tokens;
      out.text += piece;
      if (choice.finish_reason) out.finishReason = choice.finish_reason;
    }
  }
  return out;
}

// Deterministic pseudo-random numbers (mulberry32).
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ('the a model cache token replica session prompt answer stream engine block prefix batch server client request ' +
  'python function return value list dict loop index string number file line code test build run error fix').split(' ');

export function words(random, n) {
  const out = [];
  for (let i = 0; i < n; ++i) out.push(WORDS[Math.floor(random() * WORDS.length)]);
  return out.join(' ');
}

// A follow-up is a hit when its cached tokens cover the previous prompt but for its last KV block.
export function isHit(cachedTokens, previousPromptTokens) {
  return cachedTokens >= previousPromptTokens - 16;
}

export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

const sessionId = (o, id) => `bench-${o.seed}-${id}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function runSessions(o) {
  const random = rng(o.seed);
  // One system prompt for all sessions (as an application would have), then each session's own
  // first message: the prefix key is the pair's.
  const system = words(random, o.systemWords);
  const sessions = [];
  for (let s = 0; s < o.sessions; ++s) {
    const first = `session ${s}: ${words(random, o.firstWords)}`;
    const followUps = [];
    for (let t = 1; t < o.turns; ++t) followUps.push(words(random, o.userWords));
    const starts = (s * o.staggerMs) / Math.max(1, o.sessions);
    const thinks = followUps.map(() => -Math.log(1 - random()) * o.thinkMs);
    sessions.push({ id: s, first, followUps, starts, thinks });
  }
  const results = [];
  const t0 = performance.now();
  await Promise.all(
    sessions.map(async (s) => {
      await sleep(s.starts);
      let url = o.urls[s.id % o.urls.length];
      if (o.pin) {
        // Where the front sends this session's key (the key is in a header, so /health will do).
        const probe = await fetch(`${o.pin}/health`, { headers: { 'x-session-id': sessionId(o, s.id) } });
        await probe.text();
        url = o.urls[Number(probe.headers.get('x-promptly-replica').slice(1)) - 1];
      }
      const messages = [
        { role: 'system', content: system },
        { role: 'user', content: s.first },
      ];
      let previousPrompt = 0;
      let prefixKey = null;
      let replica = null;
      for (let t = 0; t < o.turns; ++t) {
        if (t > 0) {
          await sleep(s.thinks[t - 1]);
          messages.push({ role: 'user', content: s.followUps[t - 1] });
        }
        const body = { messages, max_tokens: o.answerTokens, temperature: 0, ignore_eos: true };
        if (o.model) body.model = o.model;
        const headers = {};
        if (o.key === 'session') headers['x-session-id'] = sessionId(o, s.id);
        if (o.key === 'user') body.user = `user-${o.seed}-${s.id}`;
        if (o.key === 'prefix' && prefixKey) headers['x-promptly-prefix-key'] = prefixKey;
        const r = await streamChat(url, body, headers);
        if (r.status !== 200 || !r.usage) {
          results.push({ session: s.id, turn: t, error: r.error ?? `status ${r.status}` });
          return;
        }
        prefixKey = r.prefixKey ?? prefixKey;
        const cached = r.usage.prompt_tokens_details?.cached_tokens ?? 0;
        results.push({
          session: s.id,
          turn: t,
          ttftMs: r.ttftMs,
          promptTokens: r.usage.prompt_tokens,
          cachedTokens: cached,
          hit: t > 0 ? isHit(cached, previousPrompt) : null,
          replica: r.replica,
          moved: t > 0 && replica !== null && r.replica !== replica,
        });
        replica = r.replica;
        previousPrompt = r.usage.prompt_tokens;
        messages.push({ role: 'assistant', content: r.text });
      }
    }),
  );
  const wallS = (performance.now() - t0) / 1000;
  const follow = results.filter((r) => r.turn > 0 && !r.error);
  const firsts = results.filter((r) => r.turn === 0 && !r.error);
  const perReplica = {};
  for (const r of results) if (r.replica) perReplica[r.replica] = (perReplica[r.replica] ?? 0) + 1;
  return {
    sessions: o.sessions,
    turns: o.turns,
    errors: results.filter((r) => r.error).length,
    follow_ups: follow.length,
    hit_rate: follow.filter((r) => r.hit).length / follow.length,
    cached_token_share: follow.reduce((a, r) => a + r.cachedTokens, 0) / follow.reduce((a, r) => a + r.promptTokens, 0),
    follow_up_ttft_p50_ms: percentile(follow.map((r) => r.ttftMs), 50),
    follow_up_ttft_p90_ms: percentile(follow.map((r) => r.ttftMs), 90),
    first_turn_ttft_p50_ms: percentile(firsts.map((r) => r.ttftMs), 50),
    mean_first_prompt_tokens: firsts.reduce((a, r) => a + r.promptTokens, 0) / Math.max(1, firsts.length),
    per_replica: perReplica,
    wall_s: wallS,
    results,
  };
}

function parseArgs(argv) {
  const o = {
    urls: ['http://127.0.0.1:8080'], key: 'body', sessions: 24, turns: 4, systemWords: 200, firstWords: 100, userWords: 20,
    answerTokens: 32, thinkMs: 2000, staggerMs: 4000, seed: 1, model: '', json: false, pin: '',
  };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const next = () => argv[++i];
    switch (a) {
      case '--url': o.urls = [next()]; break;
      case '--urls': o.urls = next().split(','); break;
      case '--pin': o.pin = next(); break;
      case '--key': o.key = next(); break;
      case '--sessions': o.sessions = Number(next()); break;
      case '--turns': o.turns = Number(next()); break;
      case '--system-words': o.systemWords = Number(next()); break;
      case '--first-words': o.firstWords = Number(next()); break;
      case '--user-words': o.userWords = Number(next()); break;
      case '--answer-tokens': o.answerTokens = Number(next()); break;
      case '--think-ms': o.thinkMs = Number(next()); break;
      case '--stagger-ms': o.staggerMs = Number(next()); break;
      case '--seed': o.seed = Number(next()); break;
      case '--model': o.model = next(); break;
      case '--json': o.json = true; break;
      default: throw new Error(`unknown option ${a} (see the comment at the top of tools/cluster-bench.mjs)`);
    }
  }
  if (!['session', 'user', 'prefix', 'body', 'none'].includes(o.key)) throw new Error(`--key must be session, user, prefix, body or none`);
  return o;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const o = parseArgs(process.argv.slice(2));
  const r = await runSessions(o);
  if (o.json) {
    console.log(JSON.stringify({ ...r, results: undefined }, null, 1));
  } else {
    const f = (x) => (Number.isFinite(x) ? x.toFixed(0) : '-');
    console.log(`${o.urls.join(',')} key=${o.key}: ${r.sessions} sessions x ${r.turns} turns, ${r.errors} errors, ${r.wall_s.toFixed(1)} s`);
    console.log(`  follow-ups ${r.follow_ups}: cache hit rate ${(100 * r.hit_rate).toFixed(1)}%, cached tokens ${(100 * r.cached_token_share).toFixed(1)}%`);
    console.log(`  follow-up TTFT p50 ${f(r.follow_up_ttft_p50_ms)} ms, p90 ${f(r.follow_up_ttft_p90_ms)} ms; first turn (${f(r.mean_first_prompt_tokens)} tokens) TTFT p50 ${f(r.first_turn_ttft_p50_ms)} ms`);
    console.log(`  requests per replica: ${JSON.stringify(r.per_replica)}`);
  }
  if (r.errors > 0) process.exitCode = 1;
}
