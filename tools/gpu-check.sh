#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, sized to finish in under 8 minutes there.
#
#   tools/gpu-check.sh --prepare   here (no GPU needed): builds build/gpu with CUDA, with the small
#                                  stories260K as the built-in model so that the binary stays small,
#                                  and packs .gpu/ (binaries, the shared libraries they need beyond
#                                  libc/libstdc++, two small models), ignored by git.
#   tools/gpu-check.sh             on the GPU machine (the device tool's run, carry [".gpu"]):
#                                  the GPU tests, the CLI's greedy output on GPU and CPU, the Llama-3-8B
#                                  shape benchmarks and a serve smoke test; a summary in $OUT/gpu-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  shared=$(cd ../shared/models && pwd)
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPROMPTLY_CUDA=ON -DPROMPTLY_BUILD_TESTS=ON \
    -DPROMPTLY_BUILD_BENCHMARKS=OFF -DPROMPTLY_BUILTIN_MODEL="$shared/stories260K.gguf"
  cmake --build build/gpu -j "$(nproc)" --target promptly promptly_cuda_tests
  rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib .gpu/models/code
  for b in promptly promptly_cuda_tests; do strip -o ".gpu/bin/$b" "build/gpu/$b"; done
  # What the binaries link beyond the C and C++ runtimes (which the GPU machine has, newer).
  ldd build/gpu/promptly build/gpu/promptly_cuda_tests | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | while read -r lib; do cp -L "$lib" .gpu/lib/; done
  cp "$shared/stories260K.gguf" .gpu/models/
  cp "$shared/code/code-draft-f16.gguf" .gpu/models/code/
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qsx '/.gpu/' "$exclude" || echo '/.gpu/' >> "$exclude"
  du -sh .gpu
  echo "prepared: run 'tools/gpu-check.sh' on the GPU machine with carry [\".gpu\"]"
  exit 0
fi

out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
summary="$out/gpu-summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
test -x .gpu/bin/promptly || { echo "no .gpu/: run tools/gpu-check.sh --prepare first and carry .gpu"; exit 1; }
export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# cuBLAS is opened at run time (cublas_loader.cpp) and too large to carry: the toolkit's, else the
# one PyTorch's wheels bring (nvidia-cublas), found where python3 keeps its packages.
cublas_wheel=$(python3 - 2>/dev/null <<'PY'
import glob, os, site
for d in site.getsitepackages():
    for f in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libcublas.so.1[23]"), recursive=True), reverse=True):
        print(os.path.dirname(f))
        raise SystemExit
PY
)
[ -n "$cublas_wheel" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cublas_wheel"
P=.gpu/bin/promptly
threads=$(nproc)

say "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$summary"
$P devices 2>&1 | tee -a "$summary" || $P info --devices 2>&1 | tee -a "$summary"
# The ceiling the decode floor is measured against: a device-to-device copy (bytes read + written).
timeout 60 python3 - <<'PY' 2>&1 | tee -a "$summary"
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
print(f"copy bandwidth: {2 * 20 * x.numel() / (s.elapsed_time(e) / 1e3) / 1e12:.2f} TB/s (read + write)")
PY

say "== GPU tests (kernels against the CPU, greedy output of stories260K and the code models)"
PROMPTLY_SHARED_MODELS="$PWD/.gpu/models" PROMPTLY_SOURCE_DIR="$PWD" timeout 240 .gpu/bin/promptly_cuda_tests 2>&1 | tee "$out/tests.log" | tail -n 30
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/tests.log" | tee -a "$summary"
grep -E '^\[  FAILED  \]' "$out/tests.log" | tee -a "$summary"

say "== the CLI: greedy text on the GPU and the CPU"
for m in .gpu/models/stories260K.gguf models/promptly-code-23m-q8_0.gguf; do
  cpu=$(timeout 60 $P run -m "$m" -p 'Once upon a time' -n 48 --temp 0 2>/dev/null)
  gpu=$(timeout 60 $P run -m "$m" -p 'Once upon a time' -n 48 --temp 0 --device cuda 2>"$out/run-stderr.txt")
  if [ -n "$gpu" ] && [ "$cpu" = "$gpu" ]; then say "same text: $m"; else say "DIFFERENT text: $m"; say "cpu: $cpu"; say "gpu: $gpu"; cat "$out/run-stderr.txt" >> "$summary"; fi
done
# Speculation with the draft model on the GPU beside its target (the built-in code model's pair),
# as chains and as token trees.
for mode in draft tree; do
  draft=(-m models/promptly-code-23m-q8_0.gguf --draft .gpu/models/code/code-draft-f16.gguf --spec "$mode" -p 'def fibonacci(n):' -n 64 --temp 0)
  cpu=$(timeout 60 $P run "${draft[@]}" 2>/dev/null)
  gpu=$(timeout 60 $P run "${draft[@]}" --device cuda 2>"$out/run-stderr.txt")
  if [ -n "$gpu" ] && [ "$cpu" = "$gpu" ]; then say "same text with --spec $mode on the GPU"; else say "DIFFERENT text with --spec $mode"; say "cpu: $cpu"; say "gpu: $gpu"; fi
  grep -iE 'speculation|model on|error' "$out/run-stderr.txt" | head -n 4 | tee -a "$summary"
done

# Tensor parallelism on the GPU(s): two ranks (sharing the GPU where there is one), where mpirun is.
if command -v mpirun > /dev/null; then
  one=$(timeout 60 $P run -m models/promptly-code-23m-q8_0.gguf -p 'def fibonacci(n):' -n 48 --temp 0 --device cuda 2>/dev/null)
  two=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 90 mpirun --oversubscribe -n 2 -x LD_LIBRARY_PATH \
    $P run -m models/promptly-code-23m-q8_0.gguf -p 'def fibonacci(n):' -n 48 --temp 0 --device cuda --tp 2 2>"$out/tp-stderr.txt")
  if [ -n "$two" ] && [ "$one" = "$two" ]; then say "same text with --tp 2 on the GPU"; else say "DIFFERENT text with --tp 2"; say "one: $one"; say "two: $two"; tail -n 3 "$out/tp-stderr.txt" | tee -a "$summary"; fi
else
  say "--tp 2 on the GPU skipped: no mpirun on this machine"
fi

say "== Llama-3-8B shape, random weights (targets: Q4_K_M decode >= 80% of the HBM floor; prefill 512 <= 40 ms; F16 prefill >= 50% of the bf16 peak)"
# Q4_K_M whole (llama.cpp's mix: Q4_K, Q6_K for the output and some layers' attn_v and ffn_down; its quantization is most of this script's time: ~1.5 min on 16 cores, estimated from
# TinyLlama's 100 s on 2 here); F16 as an 8-layer slice (a fraction of the tensor peak is per layer).
# GPU_CHECK_PRESET=tiny: a dry run of the script's steps on a small shape (here, without a GPU).
preset=${GPU_CHECK_PRESET:-llama3-8b}
slice=8; [ "$preset" = llama3-8b ] || slice=0
# The targets' figures first (Q4_K_M whole, then the F16 slice, each with its profile), then the
# ratios of the switches on the Q4_K_M file while the time lasts.
gen() {  # dtype layers limit: the file's path on stdout, or nothing
  local dtype=$1 layers=$2 limit=$3 f=/tmp/$preset-$1.gguf t0=$SECONDS
  local layer_flag=(); [ "$layers" -gt 0 ] && layer_flag=(--layers "$layers")
  if ! timeout "$limit" $P gen-model --preset "$preset" --dtype "$dtype" "${layer_flag[@]}" -t "$threads" -o "$f" > "$out/gen-$dtype.log" 2>&1; then
    say "gen-model $dtype failed or ran past ${limit}s" >&2; tail -n 5 "$out/gen-$dtype.log" | tee -a "$summary" >&2; rm -f "$f"; return
  fi
  say "$dtype (layers: ${layers/#0/all}): $(du -h "$f" | cut -f1), generated in $((SECONDS - t0)) s" >&2
  echo "$f"
}
headline() {  # file dtype: the bench, then where a pass's time goes (graphs off, so its total against the bench's shows what graphs save)
  timeout 150 $P bench model -m "$1" --device cuda -p 512 -n 128 -r 3 2>&1 | tee "$out/bench-$2.log" | tail -n 8 | tee -a "$summary"
  PROMPTLY_CUDA_PROFILE=1 timeout 120 $P bench model -m "$1" --device cuda -p 512 -n 32 -r 1 2>&1 | tee "$out/profile-$2.log" |
    sed -n '/^GPU profile/,$p' | tee -a "$summary"
}
row() {  # file name label setting bench-flags...: one ratio row, under the setting (NAME=VALUE), while time is left
  local f=$1 name=$2 label=$3 setting=$4; shift 4
  if [ "$SECONDS" -gt 390 ]; then say "skipped $label: ${SECONDS}s gone, keeping under 8 minutes"; return; fi
  say "$label:"
  env "$setting" timeout 90 $P bench model -m "$f" --device cuda "$@" 2>&1 | tee "$out/bench-$name.log" | tail -n 7 | tee -a "$summary"
}
q4=$(gen Q4_K_M 0 300)
[ -n "$q4" ] && headline "$q4" Q4_K_M
if [ "$SECONDS" -le 330 ] && f16=$(gen F16 "$slice" 120) && [ -n "$f16" ]; then
  headline "$f16" F16
  # The F16 file's own bytes take the joined GEMM (the Q4_K_M file's kept halves too, below).
  row "$f16" F16-three-qkv-gemms "F16 with PROMPTLY_CUDA_JOINED_QKV=0 (prefill's q, k and v products as three GEMMs instead of one)" \
    PROMPTLY_CUDA_JOINED_QKV=0 -p 512 -n 16 -r 3
  row "$f16" F16-two-gate-up-gemms "F16 with PROMPTLY_CUDA_JOINED_GATE_UP=0 (prefill's gate and up products as two GEMMs instead of one)" \
    PROMPTLY_CUDA_JOINED_GATE_UP=0 -p 512 -n 16 -r 3
  rm -f "$f16"
else
  say "skipped F16: ${SECONDS}s gone, keeping under 8 minutes"
fi
if [ -n "$q4" ]; then
  row "$q4" Q4_K_M-float-gemv "Q4_K_M with PROMPTLY_CUDA_GEMV=float (decode's products on the float kernel instead of the integer one)" \
    PROMPTLY_CUDA_GEMV=float -p 0 -n 128 -r 3
  # Decode at a long context (a long chat's later turns): 8000 positions in the cache make attention
  # read ~1 GB of KV a token (32 layers x 8 KV heads x 128 x 2 x 2 bytes x 8000), a fifth of the
  # weights' bytes (the row's floor counts both); the profile's attention stretch against the KV
  # bytes says whether a KV head's 4 query heads sharing one pass over its keys (each block reads
  # them now) would pay.
  depth=8000; [ "$preset" = llama3-8b ] || depth=128  # within the 8B shape's 8192 context, with the generated tokens
  row "$q4" Q4_K_M-depth-$depth "Q4_K_M decode with $depth positions already in the cache (-d $depth)" \
    PROMPTLY_CHECK_ROW=depth -p 0 -n 64 -r 2 -d $depth
  if [ "$SECONDS" -le 390 ]; then
    say "the attention stretch of a decode step at depth $depth (graphs off):"
    PROMPTLY_CUDA_PROFILE=1 timeout 90 $P bench model -m "$q4" --device cuda -p 0 -n 32 -r 1 -d $depth 2>&1 |
      tee "$out/profile-Q4_K_M-depth.log" | grep -E '^GPU profile|attention' | tee -a "$summary"
  fi
  # Many streams decoding at once (continuous batching): their steps past 8 tokens go through the
  # integer GEMV in rounds up to 32 tokens by default, through cuBLAS on the kept halves with
  # PROMPTLY_CUDA_GEMV_BATCH=8; the estimate says the GEMV wins at 16 and about ties at 32.
  for n in 16 32; do
    row "$q4" Q4_K_M-streams-$n "Q4_K_M, $n streams decoding at once (the integer GEMV in rounds, the default up to 32 tokens)" \
      PROMPTLY_CHECK_ROW=streams-$n -p 0 -n 32 -r 2 -s $n
    row "$q4" Q4_K_M-streams-$n-cublas "Q4_K_M, $n streams with PROMPTLY_CUDA_GEMV_BATCH=8 (cuBLAS on the kept halves past 8 tokens)" \
      PROMPTLY_CUDA_GEMV_BATCH=8 -p 0 -n 32 -r 2 -s $n
  done
  row "$q4" Q4_K_M-sampled "Q4_K_M decode drawing as run does by default (--sample: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), against greedy above" \
    PROMPTLY_CHECK_ROW=sampled -p 0 -n 128 -r 3 --sample
  # What the server's OpenAI requests draw: top_p alone over the whole row (the grouped adds of
  # add_masses), and nothing filtered.
  row "$q4" Q4_K_M-sampled-top-p "Q4_K_M decode drawing as an API request with top_p 0.95 alone (--sample=top-p: top-p over the whole vocabulary)" \
    PROMPTLY_CHECK_ROW=sampled-top-p -p 0 -n 128 -r 3 --sample=top-p
  row "$q4" Q4_K_M-sampled-api "Q4_K_M decode drawing as an API request that sets nothing (--sample=api: temperature 1, no filter)" \
    PROMPTLY_CHECK_ROW=sampled-api -p 0 -n 128 -r 3 --sample=api
  for draw in run top-p; do
    if [ "$SECONDS" -le 390 ]; then
      say "the sampler's stretch of a step drawing as --sample=$draw (graphs off):"
      PROMPTLY_CUDA_PROFILE=1 timeout 90 $P bench model -m "$q4" --device cuda -p 0 -n 32 -r 1 --sample=$draw 2>&1 |
        tee "$out/profile-Q4_K_M-sampled-$draw.log" | grep -E '^GPU profile|sampling' | tee -a "$summary"
    fi
  done
  row "$q4" Q4_K_M-no-pdl "Q4_K_M with PROMPTLY_CUDA_PDL=0 (ordinary launches instead of programmatic dependent ones)" \
    PROMPTLY_CUDA_PDL=0 -p 512 -n 128 -r 2
  row "$q4" Q4_K_M-no-fuse "Q4_K_M with PROMPTLY_CUDA_FUSE=0 (rope/KV write, the attention merge, the gated activation and a lone stream's norms in launches of their own)" \
    PROMPTLY_CUDA_FUSE=0 -p 512 -n 128 -r 2
  row "$q4" Q4_K_M-three-qkv-gemms "Q4_K_M with PROMPTLY_CUDA_JOINED_QKV=0 (prefill's q, k and v products as three GEMMs instead of one)" \
    PROMPTLY_CUDA_JOINED_QKV=0 -p 512 -n 16 -r 3
  row "$q4" Q4_K_M-no-mma "Q4_K_M with PROMPTLY_CUDA_ATTENTION_MMA=0 (the tiles' products in float on the CUDA cores instead of the tensor cores)" \
    PROMPTLY_CUDA_ATTENTION_MMA=0 -p 512 -n 16 -r 2
  row "$q4" Q4_K_M-no-tiles "Q4_K_M with PROMPTLY_CUDA_ATTENTION_TILES=0 (prefill's attention a block per token instead of tiles of 8-16 tokens sharing the keys they load)" \
    PROMPTLY_CUDA_ATTENTION_TILES=0 -p 512 -n 16 -r 2
  row "$q4" Q4_K_M-no-halves "Q4_K_M with PROMPTLY_CUDA_PREFILL_HALVES=0 (quantized weights decoded to halves on every prefill instead of once at load)" \
    PROMPTLY_CUDA_PREFILL_HALVES=0 -p 512 -n 16 -r 2
  rm -f "$q4"
fi

# IQ4_XS (the integer GEMV looks its levels up with __byte_perm, ~2.5 integer instructions a weight):
# an 8-layer slice's decode against its floor, beside the Q4_K_M file's above.
if [ "$SECONDS" -le 380 ] && iq4=$(gen IQ4_XS "$slice" 60) && [ -n "$iq4" ]; then
  row "$iq4" IQ4_XS-decode "IQ4_XS decode (layers: ${slice/#0/all})" PROMPTLY_CHECK_ROW=iq4xs -p 0 -n 64 -r 2
  rm -f "$iq4"
fi

# A mixture of experts (Qwen3-30B-A3B's shape, a 4-layer slice, Q4_K_M): decode routed on the device
# (graphs), then on the host (PROMPTLY_CUDA_MOE=host: a wait for the router each layer, no graphs),
# for the ratio.
moe_preset=qwen3-30b-a3b moe_layers=4; [ "$preset" = llama3-8b ] || { moe_preset=tiny-qwen3moe; moe_layers=2; }
if [ "$SECONDS" -lt 380 ]; then
  f=/tmp/$moe_preset-Q4_K_M.gguf
  if timeout 90 $P gen-model --preset "$moe_preset" --dtype Q4_K_M --layers "$moe_layers" -t "$threads" -o "$f" > "$out/gen-moe.log" 2>&1; then
    say "$moe_preset Q4_K_M (layers: $moe_layers): $(du -h "$f" | cut -f1)"
    timeout 90 $P bench model -m "$f" --device cuda -p 512 -n 64 -r 2 2>&1 | tee "$out/bench-moe.log" | tail -n 6 | tee -a "$summary"
    say "$moe_preset with PROMPTLY_CUDA_MOE=host:"
    PROMPTLY_CUDA_MOE=host timeout 60 $P bench model -m "$f" --device cuda -p 0 -n 64 -r 2 2>&1 | tee "$out/bench-moe-host.log" | tail -n 5 | tee -a "$summary"
  else
    say "gen-model $moe_preset failed or ran past 90 s"; tail -n 3 "$out/gen-moe.log" | tee -a "$summary"
  fi
  rm -f "$f"
else
  say "skipped the MoE shape: ${SECONDS}s gone, keeping under 8 minutes"
fi

say "== serve --device cuda: greedy, streamed and concurrent sampled completions, the GPU gauges"
# A fresh KV spool directory (serve's default one would hold older runs' blocks), outside $OUT
# (whose files come back).
spool=$(mktemp -d /tmp/gpu-check-spool.XXXXXX)
start_server() {
  $P serve -m .gpu/models/stories260K.gguf --device cuda --port 18181 --kv-spool "$spool" >> "$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 60); do curl -sf localhost:18181/health > /dev/null 2>&1 && break; sleep 0.5; done
}
story='{"prompt": "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball", "max_tokens": 24, "temperature": 0}'
start_server
curl -s localhost:18181/v1/completions -H 'Content-Type: application/json' -d "$story" | tee "$spool.story-1.json" | tee -a "$summary"; echo | tee -a "$summary"
# Sampled streams (the API's defaults: drawn on the GPU), four at once and one streamed.
clients=()
for i in 1 2 3 4; do
  curl -s localhost:18181/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"seed\": $i}" > "$out/sampled-$i.json" &
  clients+=($!)
done
wait "${clients[@]}"
for i in 1 2 3 4; do say "sampled $i: $(grep -o '"text":"[^"]*"' "$out/sampled-$i.json" | head -c 160)"; done
curl -sN localhost:18181/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24, "stream": true}' > "$out/stream.txt"
say "streamed: $(grep -c '^data: {' "$out/stream.txt") chunks, ends with: $(tail -n 2 "$out/stream.txt" | head -c 40)"
curl -s localhost:18181/metrics | grep -E '^promptly:(gpu_|engine_device_sampled|generation_tokens_total|kv_spool_written)' | tee -a "$summary"
kill $server 2>/dev/null; wait $server 2>/dev/null
say "== serve --device cuda restarted on the same KV spool: the story's blocks read back into GPU memory"
start_server
curl -s localhost:18181/v1/completions -H 'Content-Type: application/json' -d "$story" > "$spool.story-2.json"
same=$(cmp -s <(grep -o '"text":"[^"]*"' "$spool.story-1.json") <(grep -o '"text":"[^"]*"' "$spool.story-2.json") && echo same || echo DIFFERENT)
say "after the restart: $same text; $(curl -s localhost:18181/metrics | grep -E '^promptly:kv_spool_hits_total' | tr '\n' ' ')"
kill $server 2>/dev/null; wait $server 2>/dev/null
tail -n 5 "$out/serve.log" >> "$summary"

# The OpenAI-SDK server suite with --device cuda, where this machine has what it needs (node, the
# suite's npm packages, the shared models beside the checkout: a developer's GPU machine; the lent
# one has none of them, and says so).
if command -v node > /dev/null && [ -d tests/e2e/node_modules/openai ] && [ -d ../shared/models ] && [ "$SECONDS" -lt 420 ]; then
  say "== e2e server suite with PROMPTLY_E2E_SERVE_ARGS='--device cuda'"
  # Less the two tests that serve the built-in code model (.gpu's binary carries stories260K instead):
  # the others by name, as node's test runner has no pattern to leave tests out.
  wanted=$(grep -oP "^test\('\K[^']+" tests/e2e/server.test.mjs | grep -vE '^(serve without -m|tool calls the model writes)' |
    sed 's/[][\.*^$?+(){}|/]/\\&/g' | paste -sd '|')
  PROMPTLY_BINARY=.gpu/bin/promptly PROMPTLY_E2E_SERVE_ARGS='--device cuda' timeout 60 node --test --test-reporter=tap \
    --test-name-pattern="^($wanted)\$" tests/e2e/server.test.mjs > "$out/e2e-server.log" 2>&1
  grep -E '^# (pass|fail)|^not ok' "$out/e2e-server.log" | tee -a "$summary"
else
  say "e2e server suite on the GPU skipped: needs node, tests/e2e/node_modules (npm install) and ../shared/models, under 7 minutes gone"
fi
# compute-sanitizer over the kernel tests, graphs off, where it works (the Firecracker machines) and
# time is left: bad accesses (memcheck), then shared-memory races (racecheck) in the kernels whose
# warps share memory; a first GPU run is where those would show.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ] && [ "$SECONDS" -lt 400 ]; then
  say "== compute-sanitizer (graphs off)"
  for check in "memcheck CudaKernels.*:CudaSampling.*:CudaKvStore.*:CudaModel.Stories260K*" \
               "racecheck CudaKernels.PagedAttention*:CudaKernels.QkvGemv*:CudaKernels.GateUpGemv*:CudaSampling.*"; do
    read -r tool filter <<< "$check"
    left=$((450 - SECONDS)); [ "$left" -gt 20 ] || { say "$tool skipped: ${SECONDS}s gone"; continue; }
    PROMPTLY_CUDA_GRAPHS=0 PROMPTLY_SHARED_MODELS="$PWD/.gpu/models" PROMPTLY_SOURCE_DIR="$PWD" timeout $((left / 2)) \
      "$sanitizer" --tool "$tool" --error-exitcode 9 .gpu/bin/promptly_cuda_tests --gtest_filter="$filter" > "$out/$tool.log" 2>&1
    say "$tool: exit $? ($filter)"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/$tool.log" | tee -a "$summary"
    grep -m 12 -E '^=+ +(Invalid|Race|Error|Program hit)' "$out/$tool.log" | tee -a "$summary"
  done
else
  say "compute-sanitizer skipped: not on this machine, or ${SECONDS}s gone"
fi
say "== done"
