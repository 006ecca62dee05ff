#!/usr/bin/env python3
"""Client-side serving workloads against any OpenAI-compatible server (Promptly, llama-server, vLLM).

Measures what a chat user feels, from the client: time to the first streamed token (TTFT) and the
gaps between streamed tokens (ITL), over HTTP/SSE, with one thread per simulated user. Python's
standard library only, so it runs on any machine that has python3.

  tools/loadgen.py --url http://127.0.0.1:8080 WORKLOAD [--json]

Workloads (the targets of issue 31; the defaults are its sizes):
  hol          STREAMS chats decode; a LONG_WORDS-word prompt arrives among them. The streams' ITL
               p50/p99/max while it prefills, and its TTFT against the same-sized prompt alone
               (measured before and after, averaged).
  multiturn    SESSIONS conversations x TURNS turns: a ~FIRST_WORDS-word first turn, then follow-ups
               of USER_WORDS words after an exponential think time (mean THINK_S), each answer
               ANSWER_TOKENS tokens, the history resent with the server's answers. Follow-up TTFT.
  shared-prefix  One request with a ~SYSTEM_WORDS-word system prompt alone, then REQUESTS-1 more
               behind the same system prompt, USER_WORDS words each, sent together. Their TTFT
               p50/p99 and p50/p99 (progressive completion gives a small ratio).
  throughput   1 stream, then STREAMS streams decoding at once; tokens/s while all of them decode.

Random English words, so the server's prefix cache only helps where the workload means it to.
Generation uses ignore_eos (a Promptly/vLLM extension) so answers have the asked length; servers
that ignore it just answer shorter. It asks for logprobs so that every token comes in a chunk of its
own (the times are per token, not per piece of text).
"""
import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse

WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or which not have had but his they "
    "were been one their all has there more when will would who so if no what up out about into than them can only "
    "other time new some could these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go came right used take three"
).split()


def quantile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class Client:
    def __init__(self, url, model, api_key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def chat(self, messages, max_tokens, on_token=None, stop_flag=None):
        """Streams one chat completion. Returns (text, token_times, t_sent, finish_reason)."""
        body = {
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
            # One chunk per token: without it a server holds back the bytes of an unfinished UTF-8
            # character (random-weight models emit byte tokens often), and a gap of several tokens
            # would count as one inter-token latency.
            "logprobs": True,
        }
        if self.model:
            body["model"] = self.model
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t_sent = time.monotonic()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), self.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        text, times, finish = [], [], None
        try:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    n_tokens = len((choice.get("logprobs") or {}).get("content") or []) or (1 if piece else 0)
                    if piece:
                        text.append(piece)
                    now = time.monotonic()
                    for _ in range(n_tokens):
                        times.append(now)
                        if on_token:
                            on_token()
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                if stop_flag is not None and stop_flag.is_set():
                    break  # closing the connection cancels the request server-side
        finally:
            conn.close()
        return "".join(text), times, t_sent, finish


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def hol(client, a, rng):
    def solo():
        _, times, sent, _ = client.chat([{"role": "user", "content": words(rng, a.long_words)}], 1)
        return times[0] - sent

    solo_before = solo()
    stop = threading.Event()
    streams, started = [], threading.Barrier(a.streams + 1)

    def stream(i):
        first = [True]

        def on_token():
            if first[0]:
                first[0] = False
                started.wait()

        try:
            streams.append(client.chat([{"role": "user", "content": words(rng, 24)}], 4000, on_token, stop))
        except Exception:
            started.abort()  # the main thread fails at the barrier instead of waiting forever
            raise

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(a.streams)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(1.0)  # steady decoding before the long prompt lands
    _, ltimes, lsent, _ = client.chat([{"role": "user", "content": words(rng, a.long_words)}], 1)
    lfirst = ltimes[0]
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    gaps = []
    for _, times, _, _ in streams:
        for i in range(1, len(times)):
            if times[i] >= lsent and times[i - 1] <= lfirst:
                gaps.append((times[i] - times[i - 1]) * 1000)
    solo_after = solo()
    solo_ttft = (solo_before + solo_after) / 2
    ttft = lfirst - lsent
    return {
        "workload": "hol",
        "streams": a.streams,
        "long_words": a.long_words,
        "stream_itl_ms": {"p50": quantile(gaps, 0.5), "p99": quantile(gaps, 0.99), "max": max(gaps) if gaps else float("nan"), "n": len(gaps)},
        "long_ttft_s": ttft,
        "solo_ttft_s": {"before": solo_before, "after": solo_after, "mean": solo_ttft},
        "ttft_vs_solo": ttft / solo_ttft,
    }


def multiturn(client, a, rng):
    lock = threading.Lock()
    turns = []  # (session, turn, ttft_s)

    def session(s):
        r = random.Random(a.seed * 1000 + s)
        history = [
            {"role": "system", "content": "You are a helpful assistant. " + words(r, 16)},
            {"role": "user", "content": words(r, a.first_words)},
        ]
        time.sleep(r.uniform(0, a.stagger_s))
        for turn in range(a.turns):
            text, times, sent, _ = client.chat(history, a.answer_tokens)
            with lock:
                turns.append((s, turn, times[0] - sent if times else float("nan")))
            if turn + 1 == a.turns:
                break
            history.append({"role": "assistant", "content": text})
            time.sleep(r.expovariate(1.0 / a.think_s))
            history.append({"role": "user", "content": words(r, a.user_words)})

    t0 = time.monotonic()
    threads = [threading.Thread(target=session, args=(s,)) for s in range(a.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = [x[2] * 1000 for x in turns if x[1] == 0]
    follow = [x[2] * 1000 for x in turns if x[1] > 0]
    return {
        "workload": "multiturn",
        "sessions": a.sessions,
        "turns": a.turns,
        "first_words": a.first_words,
        "user_words": a.user_words,
        "answer_tokens": a.answer_tokens,
        "think_s": a.think_s,
        "followup_ttft_ms": {"p50": quantile(follow, 0.5), "p99": quantile(follow, 0.99), "max": max(follow), "n": len(follow)},
        "first_turn_ttft_ms": {"p50": quantile(first, 0.5), "p99": quantile(first, 0.99), "n": len(first)},
        "wall_s": time.monotonic() - t0,
    }


def shared_prefix(client, a, rng):
    system = {"role": "system", "content": words(rng, a.system_words)}
    client.chat([system, {"role": "user", "content": words(rng, a.user_words)}], a.answer_tokens)
    results = [None] * (a.requests - 1)

    def one(i, content):
        _, times, sent, _ = client.chat([system, {"role": "user", "content": content}], a.answer_tokens)
        results[i] = times[0] - sent

    contents = [words(rng, a.user_words) for _ in results]
    threads = [threading.Thread(target=one, args=(i, contents[i])) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ttft = [x * 1000 for x in results]
    p50, p99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
    return {
        "workload": "shared-prefix",
        "requests": a.requests,
        "system_words": a.system_words,
        "user_words": a.user_words,
        "ttft_ms": {"p50": p50, "p99": p99, "min": min(ttft), "max": max(ttft), "each": sorted(ttft)},
        "p50_over_p99": p50 / p99,
    }


def throughput(client, a, rng):
    def run(n):
        out = [None] * n

        def one(i):
            out[i] = client.chat([{"role": "user", "content": words(rng, 12)}], a.gen_tokens)[1]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = max(t[0] for t in out)
        end = min(t[-1] for t in out)
        n_tok = sum(1 for t in out for x in t if start < x <= end)
        return n_tok / (end - start)

    ones, manys = [], []
    for _ in range(a.rounds):
        ones.append(run(1))
        manys.append(run(a.streams))
    one, many = statistics.median(ones), statistics.median(manys)
    return {"workload": "throughput", "streams": a.streams, "one_tps": one, "many_tps": many, "speedup": many / one, "one_each": ones, "many_each": manys}


def print_table(r):
    w = r["workload"]
    if w == "hol":
        i = r["stream_itl_ms"]
        print(f"| hol | {r['streams']} streams' ITL p50 / p99 / max while a {r['long_words']}-word prompt prefills | "
              f"{i['p50']:.0f} / {i['p99']:.0f} / {i['max']:.0f} ms (n={i['n']}) |")
        print(f"| hol | long prompt TTFT / solo (before, after) | {r['long_ttft_s']:.2f} s / {r['solo_ttft_s']['mean']:.2f} s "
              f"({r['solo_ttft_s']['before']:.2f}, {r['solo_ttft_s']['after']:.2f}): {r['ttft_vs_solo']:.2f}x |")
    elif w == "multiturn":
        f, g = r["followup_ttft_ms"], r["first_turn_ttft_ms"]
        print(f"| multiturn | follow-up TTFT p50 / p99 / max ({f['n']} follow-ups) | {f['p50']:.0f} / {f['p99']:.0f} / {f['max']:.0f} ms |")
        print(f"| multiturn | first-turn TTFT p50 / p99 | {g['p50']:.0f} / {g['p99']:.0f} ms |")
    elif w == "shared-prefix":
        t = r["ttft_ms"]
        print(f"| shared-prefix | TTFT p50 / p99 of the {r['requests'] - 1} sent together | {t['p50']:.0f} / {t['p99']:.0f} ms "
              f"(p50/p99 {r['p50_over_p99']:.2f}; min {t['min']:.0f}) |")
    elif w == "throughput":
        print(f"| throughput | decode t/s 1 / {r['streams']} streams | {r['one_tps']:.1f} / {r['many_tps']:.1f} ({r['speedup']:.2f}x) |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["hol", "multiturn", "shared-prefix", "throughput", "all"])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="")
    p.add_argument("--api-key", default="")
    p.add_argument("--seed", type=int, default=None, help="default: from the clock, so no run finds an earlier run's prompts cached")
    p.add_argument("--streams", type=int, default=4, help="hol: decoding streams (throughput: 8 unless set)")
    p.add_argument("--long-words", type=int, default=2000)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--first-words", type=int, default=1000, help="multiturn: ~1.5k tokens with gen-model's vocabulary")
    p.add_argument("--user-words", type=int, default=60)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--think-s", type=float, default=2.0)
    p.add_argument("--stagger-s", type=float, default=2.0, help="multiturn: first turns start uniformly within this")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--system-words", type=int, default=1350, help="shared-prefix: ~2k tokens with gen-model's vocabulary")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.seed is None:
        a.seed = time.time_ns() % 1000003
    client = Client(a.url, a.model, a.api_key)
    rng = random.Random(a.seed)
    names = ["hol", "multiturn", "shared-prefix", "throughput"] if a.workload == "all" else [a.workload]
    results = []
    for n in names:
        print(f"running {n} ...", file=sys.stderr, flush=True)
        if n == "hol":
            results.append(hol(client, a, rng))
        elif n == "multiturn":
            results.append(multiturn(client, a, rng))
        elif n == "shared-prefix":
            results.append(shared_prefix(client, a, rng))
        else:
            b = argparse.Namespace(**vars(a))
            if "--streams" not in sys.argv:
                b.streams = 8
            results.append(throughput(client, b, rng))
    if a.json:
        print(json.dumps(results))
    else:
        print("| workload | metric | value |\n|---|---|---|")
        for r in results:
            print_table(r)


if __name__ == "__main__":
    main()
