#!/usr/bin/env bash
# Measures a Redis GCRA limiter (bench/redisgcra, a module of its own) on this machine, to
# set beside `pgcoord bench --only ratelimit` (docs/benchmarks.md, Against Redis). It starts
# a throwaway redis-server without persistence on a free loopback port, runs the program
# against it with the arguments given (e.g. --duration 2s, --json), and stops it.
#
# Usage: scripts/bench-redis.sh [redisgcra flags]     (make bench-redis ARGS='--duration 2s')
# It installs nothing: it needs redis-server (Debian: apt-get install redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "bench-redis: redis-server and redis-cli are missing: install them (Debian: apt-get install redis-server)" >&2
  exit 1
fi

dir=$(mktemp -d)
pid=
stop() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap stop EXIT

# A free port: one nothing answers on, and that redis-server then manages to bind.
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    continue
  fi
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$dir" \
    --daemonize no --logfile "$dir/redis.log" &
  pid=$!
  for _ in $(seq 50); do
    if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then
      break 2
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
done
if [[ -z $pid ]]; then
  echo "bench-redis: could not start redis-server on a free port; its last log:" >&2
  tail -n 20 "$dir/redis.log" >&2 || true
  exit 1
fi

cd bench/redisgcra
go run . --addr "127.0.0.1:$port" "$@"
