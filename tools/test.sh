#!/usr/bin/env bash
# The whole test suite: release build + tests, the server's end-to-end tests (OpenAI Node SDK, load
# test), debug build (ASan+UBSan) + tests, and bounded libFuzzer runs (GGUF reader, chat templates,
# API request parser). Needs ../shared/models beside the checkout.
# FUZZ_SECONDS (default 60) bounds the fuzzing; 0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0
# ctest's summary line "100% tests passed, 0 tests failed out of N" gives the count for this run.
count_passed() { passed=$((passed + $(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1))); }

echo "== release build and tests"
cmake --preset release -DPROMPTLY_WERROR=ON -DPROMPTLY_BUILD_TESTS=ON
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs" | tee "$log"
count_passed

echo "== quick start: the built-in model without -m (tools/quickstart.sh's command)"
./build/release/promptly run -p 'def fibonacci(n):' -n 96 --temp 0 | tee "$log"
grep -q '"""' "$log" || { echo "quick start: no docstring in the built-in model's continuation"; exit 1; }
echo "quick start: ok"
passed=$((passed + 1))

echo "== end-to-end: promptly serve through the OpenAI Node SDK, then a bounded load test"
(cd tests/e2e && npm install --no-audit --no-fund --silent)
PROMPTLY_BINARY="$PWD/build/release/promptly" PROMPTLY_SHARED_MODELS="$(cd ../shared/models && pwd)" \
  node --test --test-reporter=tap tests/e2e/ | tee "$log"
e2e_passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log")
[ "$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log")" = "0" ] || { echo "end-to-end tests failed"; exit 1; }
passed=$((passed + e2e_passed))

echo "== debug build (ASan + UBSan) and tests"
cmake --preset debug -DPROMPTLY_WERROR=ON -DPROMPTLY_BUILD_TESTS=ON
cmake --build --preset debug -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset debug -j "$jobs" | tee "$log"
count_passed
echo "== end-to-end tests against the ASan+UBSan server (a sanitizer report or a leak fails its clean exit)"
ASAN_OPTIONS=detect_leaks=1 PROMPTLY_BINARY="$PWD/build/debug/promptly" PROMPTLY_SHARED_MODELS="$(cd ../shared/models && pwd)" \
  node --test --test-reporter=tap tests/e2e/ | tee "$log"
[ "$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log")" = "0" ] || { echo "end-to-end tests (sanitized) failed"; exit 1; }
passed=$((passed + $(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log")))

fuzz_seconds=${FUZZ_SECONDS:-60}
if [ "$fuzz_seconds" -gt 0 ]; then
  echo "== fuzzing the GGUF reader for ${fuzz_seconds}s"
  CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPROMPTLY_BUILD_FUZZERS=ON -DPROMPTLY_SANITIZE=ON -DPROMPTLY_BUILD_TESTS=OFF -DPROMPTLY_CUDA=OFF
  cmake --build build/fuzz --target gguf_fuzzer jinja_fuzzer api_fuzzer -j "$jobs"
  corpus=$(mktemp -d)
  trap 'rm -rf "$corpus" "$log"' EXIT
  # The GGUF reader gets two thirds of the time; the chat-template interpreter the rest, seeded
  # with the real templates.
  mkdir "$corpus/gguf" "$corpus/jinja" "$corpus/api"
  cp fuzz/seeds/* "$corpus/gguf/"
  cp fuzz/seeds_api/* "$corpus/api/"
  cp ../shared/models/templates/*.jinja "$corpus/jinja/"
  ./build/fuzz/gguf_fuzzer -max_total_time=$((fuzz_seconds * 2 / 3)) -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$corpus/gguf" 2>&1 | tail -n 4
  ./build/fuzz/jinja_fuzzer -max_total_time=$((fuzz_seconds / 3)) -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$corpus/jinja" 2>&1 | tail -n 4
  ./build/fuzz/api_fuzzer -max_total_time=$((fuzz_seconds / 3)) -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$corpus/api" 2>&1 | tail -n 4
  echo "fuzzing: no crash"
  passed=$((passed + 3))
fi
# Any failure above has already stopped the script (set -e, pipefail), so reaching here means none failed.
echo "summary: ${passed} passed, 0 failed"
