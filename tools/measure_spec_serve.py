#!/usr/bin/env python3
"""Decode throughput of a running `promptly serve` for 1 and N concurrent greedy streams of code.

Usage: tools/measure_spec_serve.py [--url http://127.0.0.1:8080] [--prompts ../shared/models/code/val.txt]
                                   [--streams 1,8] [--tokens 256] [--prompt-bytes 1000] [--rounds 3] [--json]

Each stream is one /v1/completions request (temperature 0, ignore_eos, streamed, no logprobs: a
request asking for logprobs is never speculated) whose prompt is a code prefix cut at a line start
from the prompt file, a different one per stream and round (so that no round finds an earlier
round's prompt in the prefix cache). A round's figure is the tokens all its streams generated over
the wall time from the first request sent to the last stream's end; the median of the rounds is
reported. Run it against `serve` with and without `--draft` (README, Speculative decoding).
Standard library only.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def cut_prompts(text, count, size):
    prompts = []
    for i in range(count):
        start = (len(text) - size) * i // count
        while start > 0 and text[start - 1] != "\n":
            start -= 1
        end = min(len(text), start + size)
        while end < len(text) and text[end - 1] != "\n":
            end += 1
        prompts.append(text[start:end])
    return prompts


def complete(url, prompt, tokens):
    """Streams one completion; returns the number of tokens the server reports it generated."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    generated = 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        usage = json.loads(line[5:]).get("usage")
        if usage:
            generated = usage["completion_tokens"]
    conn.close()
    return generated


def round_tps(url, prompts, tokens):
    counts = [0] * len(prompts)

    def one(i):
        counts[i] = complete(url, prompts[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--prompts", default="../shared/models/code/val.txt")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt-bytes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    streams = [int(s) for s in a.streams.split(",")]
    with open(a.prompts, encoding="utf-8") as f:
        text = f.read()
    pool = cut_prompts(text, a.rounds * sum(streams), a.prompt_bytes)
    result, next_prompt = {}, 0
    for n in streams:
        rounds = []
        for _ in range(a.rounds):
            rounds.append(round_tps(a.url, pool[next_prompt:next_prompt + n], a.tokens))
            next_prompt += n
        result[str(n)] = {"tps": statistics.median(rounds), "rounds": rounds}
        if not a.json:
            print(f"{n} stream(s): {result[str(n)]['tps']:.1f} t/s (rounds: {', '.join(f'{r:.1f}' for r in rounds)})", flush=True)
    if a.json:
        json.dump(result, sys.stdout, indent=2)
        print()


if __name__ == "__main__":
    main()
