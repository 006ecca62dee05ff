#!/usr/bin/env bash
# From a fresh clone to generated text: installs dependencies, builds the release binary and runs
# the model you name (or a small random-weight demo model Promptly generates itself).
#   tools/quickstart.sh [MODEL.gguf] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset release -DPROMPTLY_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release --target promptly
model=${1:-}
prompt=${2:-Once upon a time}
if [ -n "$model" ]; then
  exec ./build/release/promptly run -m "$model" -p "$prompt" -n 128
else
  exec ./build/release/promptly run -p "$prompt" -n 64
fi
