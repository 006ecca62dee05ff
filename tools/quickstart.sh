#!/usr/bin/env bash
# From a fresh clone to generated text: installs dependencies, builds the release binary and runs
# the model you name, or the built-in one (promptly-code-23m, a small trained Python code model).
#   tools/quickstart.sh [MODEL.gguf] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset release -DPROMPTLY_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release --target promptly
model=${1:-}
if [ -n "$model" ]; then
  exec ./build/release/promptly run -m "$model" -p "${2:-Once upon a time}" -n 128
else
  exec ./build/release/promptly run -p "${2:-def fibonacci(n):}" -n 96 --temp 0
fi
