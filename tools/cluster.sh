#!/usr/bin/env bash
# Promptly replicas behind HAProxy on this machine, with cache affinity (deploy/haproxy/haproxy.cfg).
#
#   tools/cluster.sh up N [MODEL|builtin] [SERVE ARGS...]   N replicas + HAProxy; returns when all serve
#   tools/cluster.sh status                                 which replicas and HAProxy run, on which ports
#   tools/cluster.sh down                                   drains the replicas (SIGTERM), then stops HAProxy
#
# Replica i (1..N) is `promptly serve [-m MODEL] --port BASE+i -t 1 --drain-delay 2 ARGS...` (`-t`
# and `--drain-delay` only when ARGS give none); HAProxy (Debian's `haproxy` package) listens on 127.0.0.1:PORT.
# Environment: PROMPTLY_CLUSTER_PORT (8080), PROMPTLY_CLUSTER_BASE_PORT (PORT), PROMPTLY_BINARY
# (build/release/promptly), PROMPTLY_CLUSTER_DIR (build/cluster: the generated haproxy.cfg, pid files,
# logs, HAProxy's admin socket haproxy.sock), PROMPTLY_CLUSTER_BALANCE (another HAProxy `balance`
# algorithm instead of the session-key hash, e.g. roundrobin, for comparisons).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${PROMPTLY_CLUSTER_DIR:-$root/build/cluster}"
port="${PROMPTLY_CLUSTER_PORT:-8080}"
base="${PROMPTLY_CLUSTER_BASE_PORT:-$port}"
binary="${PROMPTLY_BINARY:-$root/build/release/promptly}"
template="$root/deploy/haproxy/haproxy.cfg"

usage() {
  sed -n '4,6p' "$0" | sed 's/^# *//' >&2
  exit 2
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Waits for process $1 (pid file) to exit, up to $2 seconds; 0 if it did.
wait_exit() {
  local pidfile=$1 limit=$2 i
  for ((i = 0; i < limit * 10; i++)); do
    alive "$pidfile" || return 0
    sleep 0.1
  done
  return 1
}

up() {
  [ $# -ge 1 ] || usage
  local n=$1
  shift
  local model=builtin
  if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    model=$1
    shift
  fi
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: N must be a positive number, not '$n'" >&2; exit 2; }
  command -v haproxy >/dev/null || { echo "cluster.sh: haproxy is not installed (tools/install-deps.sh installs it)" >&2; exit 1; }
  [ -x "$binary" ] || { echo "cluster.sh: no promptly binary at $binary (build it, or set PROMPTLY_BINARY)" >&2; exit 1; }
  if alive "$dir/haproxy.pid"; then
    echo "cluster.sh: a cluster already runs from $dir (tools/cluster.sh down first)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  rm -f "$dir"/replica-*.pid "$dir"/replica-*.log "$dir"/replica-*.port
  local args=("$@") threads=(-t 1) drain=(--drain-delay 2) a
  for a in "${args[@]}"; do
    case "$a" in
      -t | --threads | -t* | --threads=*) threads=() ;;
      --drain-delay | --drain-delay=*) drain=() ;;
    esac
  done
  local model_args=()
  [ "$model" = builtin ] || model_args=(-m "$model")

  local i p
  for ((i = 1; i <= n; i++)); do
    p=$((base + i))
    # setsid: the replica outlives this script and gets only the signals sent to it.
    setsid "$binary" serve "${model_args[@]}" --port "$p" "${threads[@]}" "${drain[@]}" "${args[@]}" \
      </dev/null >"$dir/replica-$i.log" 2>&1 &
    echo $! >"$dir/replica-$i.pid"
    echo "$p" >"$dir/replica-$i.port"
  done
  # Every replica has loaded its model and listens once it prints its address.
  for ((i = 1; i <= n; i++)); do
    local waited=0
    until grep -q 'serving .* on http://' "$dir/replica-$i.log" 2>/dev/null; do
      if ! alive "$dir/replica-$i.pid"; then
        echo "cluster.sh: replica $i did not start:" >&2
        tail -n 20 "$dir/replica-$i.log" >&2
        down >/dev/null 2>&1 || true
        exit 1
      fi
      sleep 0.1
      waited=$((waited + 1))
      if [ $waited -gt 1200 ]; then
        echo "cluster.sh: replica $i did not start in 120 s" >&2
        down >/dev/null 2>&1 || true
        exit 1
      fi
    done
  done

  # HAProxy's configuration: the template with this cluster's address, admin socket and replicas.
  {
    awk -v bind="127.0.0.1:$port" -v sock="$dir/haproxy.sock" -v balance="${PROMPTLY_CLUSTER_BALANCE:-}" '
      /^[ \t]*server[ \t]+r[0-9]+[ \t]/ { next }
      /^[ \t]*balance[ \t]/ && balance != "" { print "    balance " balance; next }
      /^[ \t]*bind[ \t]/ { sub(/[0-9.]+:[0-9]+/, bind) }
      { print }
      /^global/ { print "    stats socket " sock " mode 600 level admin" }
    ' "$template"
    for ((i = 1; i <= n; i++)); do
      echo "    server r$i 127.0.0.1:$((base + i))"
    done
  } >"$dir/haproxy.cfg"
  haproxy -c -q -f "$dir/haproxy.cfg"
  setsid haproxy -db -f "$dir/haproxy.cfg" </dev/null >"$dir/haproxy.log" 2>&1 &
  echo $! >"$dir/haproxy.pid"
  local waited=0
  until (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! alive "$dir/haproxy.pid" || [ $waited -gt 100 ]; then
      echo "cluster.sh: haproxy did not start:" >&2
      cat "$dir/haproxy.log" >&2
      down >/dev/null 2>&1 || true
      exit 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  echo "$port" >"$dir/front.port"
  echo "cluster: $n replicas on 127.0.0.1:$((base + 1))-$((base + n)) behind HAProxy on http://127.0.0.1:$port (logs in $dir)"
}

status() {
  local f i
  for f in "$dir"/replica-*.pid; do
    [ -e "$f" ] || continue
    i=$(basename "$f" .pid)
    i=${i#replica-}
    if alive "$f"; then
      echo "replica $i: pid $(cat "$f"), port $(cat "$dir/replica-$i.port")"
    else
      echo "replica $i: not running"
    fi
  done
  if alive "$dir/haproxy.pid"; then
    echo "haproxy: pid $(cat "$dir/haproxy.pid"), http://127.0.0.1:$(cat "$dir/front.port" 2>/dev/null || echo "$port")"
  else
    echo "haproxy: not running"
  fi
}

down() {
  local f
  # Replicas first: each drains (its /health says 503, HAProxy stops sending to it), finishes its
  # streams and exits; then HAProxy.
  for f in "$dir"/replica-*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then kill -TERM "$(cat "$f")" 2>/dev/null || true; fi
  done
  for f in "$dir"/replica-*.pid; do
    [ -e "$f" ] || continue
    if ! wait_exit "$f" 30; then kill -KILL "$(cat "$f")" 2>/dev/null || true; fi
    rm -f "$f"
  done
  if alive "$dir/haproxy.pid"; then
    kill -TERM "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
    wait_exit "$dir/haproxy.pid" 10 || kill -KILL "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
  fi
  rm -f "$dir/haproxy.pid" "$dir/haproxy.sock"
  echo "cluster: stopped"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  *) usage ;;
esac
