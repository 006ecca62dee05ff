// `mpirun -n 2 promptly serve --tp 2`: rank 0 serves HTTP and schedules, both ranks compute. The
// answers are the single-process ones, follow-ups hit the prefix cache, and a rank that dies makes
// rank 0 fail the in-flight stream with an error and exit (no hang). Skips where mpirun or an MPI
// build is missing (tools/install-deps.sh installs OpenMPI, so CI runs this).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, STORIES, listeningPort, runGreedy } from './helpers.mjs';

const haveMpi =
  spawnSync('mpirun', ['--version']).status === 0 &&
  !/built without MPI/.test(spawnSync(BINARY, ['run', '-m', STORIES, '-n', '1', '--tp', '2']).stderr.toString());
const skip = haveMpi ? false : 'needs mpirun and a promptly built with MPI (tools/install-deps.sh installs OpenMPI)';

// Root may run mpirun (CI); OpenMPI's own allocations are not ours to leak-check under ASan. mpirun
// gives rank 0 three seconds after a rank dies (--mca odls_base_sigkill_timeout; the default, one,
// leaves it no time to answer its clients).
const mpiEnv = {
  ...process.env,
  OMPI_ALLOW_RUN_AS_ROOT: '1',
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1',
  ASAN_OPTIONS: 'detect_leaks=0',
  // Containers may forbid the cross-process reads of OpenMPI's single-copy transfers; the tests' small
  // messages do not need them.
  OMPI_MCA_btl_vader_single_copy_mechanism: 'none',
};

async function startTensorParallel(args) {
  const proc = spawn('mpirun', ['--oversubscribe', '--mca', 'odls_base_sigkill_timeout', '3', '-n', '2', BINARY, 'serve', '--tp', '2', '--port', '0', '-t', '1', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: mpiEnv,
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const { port, log } = await listeningPort(proc, 60000);
  // The ranks are mpirun's children; OpenMPI tells each its rank in the environment.
  const ranks = () =>
    spawnSync('pgrep', ['-P', String(proc.pid)])
      .stdout.toString()
      .split('\n')
      .filter(Boolean)
      .map(Number)
      .map((pid) => {
        try {
          const m = readFileSync(`/proc/${pid}/environ`, 'latin1').match(/OMPI_COMM_WORLD_RANK=(\d+)/);
          return m ? { pid, rank: Number(m[1]) } : null;
        } catch {
          return null;
        }
      })
      .filter(Boolean);
  return { proc, baseURL: `http://127.0.0.1:${port}`, log, exited, ranks };
}

async function complete(baseURL, body) {
  const res = await fetch(`${baseURL}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(res.status, 200);
  return res.json();
}

test('two ranks answer as one process, and follow-ups hit the prefix cache', { skip, timeout: 120000 }, async () => {
  const server = await startTensorParallel(['-m', STORIES, '--kv-spool', 'none']);
  try {
    const prompt = 'Once upon a time, there was a little dog named Max. Max liked to run in the park with his friends.';
    const want = runGreedy(STORIES, prompt, 40);
    const first = await complete(server.baseURL, { prompt, max_tokens: 40, temperature: 0 });
    assert.equal(first.choices[0].text, want.text);
    const again = await complete(server.baseURL, { prompt: prompt + first.choices[0].text + ' The end.', max_tokens: 8, temperature: 0 });
    assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 32, JSON.stringify(again.usage));
  } finally {
    server.proc.kill('SIGTERM');
    await server.exited;
  }
  assert.match(server.log(), /rank 1 of 2 done/);  // rank 0 drained, then told rank 1 to stop
});

test('a rank that dies fails the stream with an error and the job exits', { skip, timeout: 180000 }, async () => {
  // A model slow enough that the stream is still going when the rank dies: 125m's shape (random weights).
  const dir = mkdtempSync(path.join(os.tmpdir(), 'promptly-tp-'));
  const model = path.join(dir, '125m.gguf');
  execFileSync(BINARY, ['gen-model', '--preset', '125m', '--dtype', 'Q8_0', '-o', model], { stdio: 'ignore' });
  const server = await startTensorParallel(['-m', model, '--kv-spool', 'none']);
  try {
    const res = await fetch(`${server.baseURL}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, stream: true }),
    });
    if (res.status !== 200) assert.fail(`status ${res.status}: ${await res.text()}`);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    let killed = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      if (!killed && (text.match(/"text"/g) ?? []).length >= 10) {
        const rank1 = server.ranks().find((r) => r.rank === 1);
        assert.ok(rank1, "rank 1 not found among mpirun's children");
        process.kill(rank1.pid, 'SIGKILL');
        killed = true;
      }
    }
    assert.ok(killed);
    assert.match(text.slice(-2000), /"error":\{"message":"[^"]*tensor parallelism: no answer from the other ranks/, server.log());
    const t0 = Date.now();
    const ended = await Promise.race([server.exited.then(() => true), new Promise((r) => setTimeout(() => r(false), 20000))]);
    assert.ok(ended, `mpirun still running ${(Date.now() - t0) / 1000} s after the stream ended:\n${server.log()}`);
  } finally {
    server.proc.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a model that does not split is refused on every rank', { skip, timeout: 60000 }, async () => {
  const r = spawnSync('mpirun', ['--oversubscribe', '-n', '3', BINARY, 'run', '-m', STORIES, '-n', '1', '--tp', '3'], { env: mpiEnv, timeout: 60000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr.toString(), /--tp 3: the model's 8 attention heads do not split into 3 equal parts/);
});
