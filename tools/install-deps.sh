#!/usr/bin/env bash
# Installs the Debian (bookworm) packages Promptly builds and tests with. Skips apt entirely when
# everything is already there, so repeated runs cost nothing.
set -euo pipefail
packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev ccache
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libboost-dev
  chromium  # the web UI's browser test (tests/e2e/webui.test.mjs) drives it headless
  haproxy   # tools/cluster.sh and the cluster test (tests/e2e/cluster.test.mjs): replicas behind it
  libopenmpi-dev openmpi-bin  # tensor parallelism (--tp under mpirun) and its test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The end-to-end tests run the OpenAI Node SDK: Debian's node only where the machine has none.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
