#!/usr/bin/env bash
# Rebuilds the web UI's committed assets (webui/dist/) from webui/src with the exact npm versions of
# webui/package-lock.json. A C++ build never runs this: the server embeds the committed files, so
# building promptly needs no node. Run it after changing webui/src and commit webui/dist with it.
set -euo pipefail
cd "$(dirname "$0")/../webui"
npm ci --no-audit --no-fund --silent
node build.mjs
