#!/usr/bin/env bash
# Instructions per EVALSHA of ratewatch's decide script (one token bucket)
# and of benches/suite/minimal_token_bucket.lua, counted by callgrind inside
# redis-server: a figure a busy machine does not move, unlike usec_per_call.
#
#   bench/script-cost.sh            # 3000 calls each
#   CALLS=10000 bench/script-cost.sh
#
# Two cases: the benchmark's bucket (capacity 1e9, refill 1e6/s: its key
# expires between calls) and a slow refill (the key is read every call).
# Needs valgrind, redis-server, redis-cli, redis-benchmark; binds 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${CALLS:-3000}
PORT=${PORT:-$((20000 + RANDOM % 20000))}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

# The decide script exactly as src/store/script.rs builds DECIDE_LUA.
{
  echo "local ENTRY = 'decide'"
  cat lua/common.lua lua/token_bucket.lua lua/sliding_window.lua lua/sliding_log.lua \
    lua/fixed_window.lua lua/gcra.lua lua/leaky_bucket.lua lua/decide.lua
} >"$DIR/decide.lua"

cost() { # label script args...
  local label=$1 script=$2
  shift 2
  valgrind --tool=callgrind --toggle-collect=evalShaCommand \
    --callgrind-out-file="$DIR/$label.out" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 200); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  local sha
  sha=$(redis-cli -p "$PORT" script load "$(cat "$script")")
  redis-benchmark -p "$PORT" -c 1 -n "$CALLS" -q EVALSHA "$sha" "$@" >/dev/null 2>&1
  redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  local total
  total=$(grep -m1 '^totals:\|^summary:' "$DIR/$label.out" | awk '{print $2}')
  echo $((total / CALLS))
}

for refill in 1000000 1; do
  ours=$(cost ours "$DIR/decide.lua" 1 'rw:{_Vb86PVN0S6cWyWv}:AbCd_' '' 1 0 token_bucket 0 1000000000 "$refill" 0)
  minimal=$(cost minimal benches/suite/minimal_token_bucket.lua 1 'bench:minimal:{free_bench_key_0001}' 1000000000 "$refill" 1)
  awk -v r="$refill" -v o="$ours" -v m="$minimal" 'BEGIN {
    printf "refill %s/s: decide script %d instructions/call, minimal %d, minimal/decide %.3f\n", r, o, m, m / o
  }'
done
