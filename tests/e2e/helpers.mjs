// Starts `promptly serve` on a free loopback port and stops it; shared by the e2e tests.
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

export const BINARY = process.env.PROMPTLY_BINARY ?? path.resolve('build/release/promptly');
export const SHARED = process.env.PROMPTLY_SHARED_MODELS ?? path.resolve('../shared/models');
export const STORIES = path.join(SHARED, 'stories260K.gguf');

// `serve` keeps a KV spool in $XDG_CACHE_HOME by default: every server a test process starts (and
// tools/cluster.sh's replicas) uses a scratch one, never the user's, and no run sees another's blocks.
process.env.XDG_CACHE_HOME = mkdtempSync(path.join(tmpdir(), 'promptly-e2e-cache-'));
process.on('exit', () => rmSync(process.env.XDG_CACHE_HOME, { recursive: true, force: true }));

// Flags added to every server a test starts: PROMPTLY_E2E_SERVE_ARGS='--device cuda' runs the suite
// against the GPU backend (on a machine without a GPU, serve says so and runs on the CPU).
const EXTRA_SERVE_ARGS = (process.env.PROMPTLY_E2E_SERVE_ARGS ?? '').split(/\s+/).filter(Boolean);

export async function startServer(args, { env } = {}) {
  const threads = args.includes('-t') ? [] : ['-t', '1'];
  const proc = spawn(BINARY, ['serve', '--port', '0', ...threads, ...args, ...EXTRA_SERVE_ARGS], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  const { port, log } = await listeningPort(proc, 30000);
  const baseURL = `http://127.0.0.1:${port}`;
  return {
    proc,
    port,
    baseURL,
    log,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
      proc.kill('SIGTERM');
      return exited;
    },
  };
}

// The port a starting `promptly serve` (or mpirun running one) announces on stderr; `log()` gives
// everything it wrote so far.
export async function listeningPort(proc, timeoutMs) {
  let text = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${text}`)), timeoutMs);
    proc.stderr.on('data', (chunk) => {
      text += chunk.toString();
      const m = text.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${text}`)));
  });
  return { port, log: () => text };
}

// Greedy text from `promptly run` for the same prompt, the reference the server must reproduce.
export function runGreedy(model, prompt, n) {
  const out = execFileSync(BINARY, ['run', '-m', model, '-p', prompt, '-n', String(n), '--temp', '0', '--json'], { stdio: ['ignore', 'pipe', 'ignore'] });
  return JSON.parse(out.toString());
}

export async function metrics(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name.replace(/[{}"=:]/g, (c) => '\\' + c)} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, value };
}

export async function waitFor(fn, what, timeoutMs = 10000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function rssKb(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return Number(m[1]);
}
