#!/usr/bin/env bash
# User-space instructions per request of one benchmark server, counted by
# callgrind: steadier than CPU time on a shared machine. The server runs
# under valgrind against its own redis-server; counters are zeroed after
# 200 warm-up requests, then N requests go over 8 keep-alive connections.
#
#   bench/instructions.sh rw-redis-1          # 2000 requests
#   bench/instructions.sh rw-memory-1 5000
#   BIN=/tmp/suite-before bench/instructions.sh rw-redis-1
#
# Prints the counts (allocations are calls to malloc, calloc, realloc and
# the aligned allocators: bench/alloc-calls.py) and leaves the callgrind profile in $OUT (default
# /tmp/ratewatch-callgrind.VARIANT) for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?variant, e.g. rw-redis-1}
n=${2:-2000}
out=${OUT:-/tmp/ratewatch-callgrind.$variant}
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }

# BIN=path runs an already built suite binary (a copy of an older build,
# to count before and after side by side).
bin=${BIN:-}
if [ -z "$bin" ]; then
  cargo bench --bench suite --no-run 2>/dev/null
  bin=$(cargo bench --bench suite --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*suite[^"]*\)".*/\1/p' | tail -1)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port); sport=$(free_port)
dir=$(mktemp -d)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" \
  "$bin" serve "$variant" "$sport" "redis://127.0.0.1:$rport" >/dev/null 2>"$dir/valgrind.log" &
vpid=$!
cleanup() {
  kill "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
  redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
}
trap cleanup EXIT
for _ in $(seq 300); do
  curl -sf -o /dev/null -H "x-api-key: free_bench_key_0001" "http://127.0.0.1:$sport/api/data" && break
  sleep 0.2
done
"$bin" requests "$sport" 200 8
callgrind_control -z "$vpid" >/dev/null 2>&1
"$bin" requests "$sport" "$n" 8
callgrind_control -d "$vpid" >/dev/null 2>&1
sleep 1
dump=$(ls "$dir"/cg.*.1)
cp "$dump" "$out"
total=$(sed -n 's/^summary: *//p; s/^totals: *//p' "$out" | sort -n | tail -1)
allocs=$(python3 bench/alloc-calls.py "$out")
echo "$variant: $((total / n)) instructions and $(python3 -c "print(f'{$allocs / $n:.1f}')") allocations per request ($n requests; profile in $out)"
