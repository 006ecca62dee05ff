#!/usr/bin/env python3
"""A long conversation's KV memory on a sliding-window model (README, Architectures).

Starts `promptly serve` on MODEL (its own fresh spool directory under /tmp), sends a 5,200-token
prompt (64 tokens generated), then its follow-up, and prints one JSON line: the follow-up's cached
tokens and latency, and after each turn `promptly:kv_cache_bytes_in_use` and the resident memory.

usage: tools/measure_window_kv.py BINARY MODEL PORT LABEL [serve flags...]
"""
import json, os, re, signal, subprocess, sys, tempfile, time, urllib.request
binary, model, port, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
extra = sys.argv[5:]
scratch = tempfile.mkdtemp(prefix=f"promptly-window-kv-{label}-")
env = dict(os.environ, XDG_CACHE_HOME=scratch)
p = subprocess.Popen([binary, "serve", "-m", model, "--port", str(port), "--threads", "2"] + extra, stdout=subprocess.DEVNULL,
                     stderr=open(os.path.join(scratch, "serve.log"), "w"), env=env)
base = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception: time.sleep(0.5)
def post(body):
    t = time.time()
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=600))
    return r, time.time() - t
def metrics():
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    out = {}
    for name in ["promptly:kv_cache_bytes_in_use", "process_resident_memory_bytes", "promptly:process_resident_memory_bytes"]:
        m = re.search(r"^" + re.escape(name) + r"\S* ([0-9.e+]+)$", text, re.M)
        if m: out[name] = float(m.group(1))
    return out
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near the old river bank".split()
prompt = " ".join(words[(i * 7) % len(words)] for i in range(2600))
r1, t1 = post({"prompt": prompt, "max_tokens": 64, "temperature": 0})
m1 = metrics()
prompt2 = prompt + r1["choices"][0]["text"] + " and then the fox said hello again to the dog"
r2, t2 = post({"prompt": prompt2, "max_tokens": 16, "temperature": 0})
m2 = metrics()
print(json.dumps({"label": label, "turn1_prompt_tokens": r1["usage"]["prompt_tokens"], "turn1_s": round(t1, 2),
                  "turn2_prompt_tokens": r2["usage"]["prompt_tokens"], "turn2_cached": (r2["usage"].get("prompt_tokens_details") or {}).get("cached_tokens"),
                  "turn2_s": round(t2, 2), "after_turn1": m1, "after_turn2": m2, "text1": r1["choices"][0]["text"][:60], "text2": r2["choices"][0]["text"][:60]}))
p.send_signal(signal.SIGTERM); p.wait(timeout=60)
