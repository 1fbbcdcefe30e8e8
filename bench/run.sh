#!/usr/bin/env bash
# ratewatch's side-by-side benchmark: HTTP with wrk against bare axum, a
# header floor, tower_governor, ratewatch (memory, Redis, Redis Cluster) and
# a naive Redis limiter; Limiter::check against governor; the redis-benchmark
# ceiling of the decide script; telemetry on/off; Redis bytes per identity;
# the decision service over gRPC (h2load) and through a real Envoy (wrk;
# the Envoy .ci/test.sh installs, rows left out without it), beside Envoy
# with a do-nothing RLS; a three-unit tier (rpm, tpm, concurrency) against
# one limit; `ratewatch serve`'s edge bounds against none; a cold release
# build of the server and the crates of the lean default.
# Only some rows: `cargo bench --bench suite -- units|edge|rls SECS`.
# One run, rounds interleaved; writes BENCHMARKS.md (ratios first).
#
#   bench/run.sh                       # default: 2 rounds of 5 s (a few minutes)
#   bench/run.sh --rounds 3 --secs 10  # longer, steadier
#   bench/run.sh --out /tmp/b.md       # elsewhere
#   BENCH_BUILD=0 bench/run.sh         # without the cold build (saves minutes)
#
# Servers bind 127.0.0.1 only and are stopped when the run ends; the whole
# run is bounded by BENCH_TIMEOUT seconds (default 1200).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v redis-server >/dev/null || need+=(redis-server)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v curl >/dev/null || need+=(curl)
if ((${#need[@]})); then
  echo "bench: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

# The build goals, measured first while the machine is quiet: a cold
# release build of the server into an empty target directory (its
# --timings report names the heaviest units) and the crates of the lean
# default. BENCH_BUILD=0 leaves them out (the rows then say so).
if [ "${BENCH_BUILD:-1}" != 0 ]; then
  build_dir=$(mktemp -d)
  trap 'rm -rf "$build_dir"' EXIT
  echo "bench: cold release build of --features server (a few minutes)" >&2
  start=$(date +%s.%N)
  CARGO_TARGET_DIR="$build_dir/target" cargo build -q --release --features server --timings \
    2>"$build_dir/build.log" || { cat "$build_dir/build.log" >&2; exit 1; }
  end=$(date +%s.%N)
  crates=$(cargo tree -e normal --prefix none --no-dedupe |
    sed 's/ (\*)//; s/ (proc-macro)//' | sort -u | wc -l)
  {
    echo "wall_secs=$(python3 -c "print(f'{$end - $start:.1f}')")"
    echo "crates=$crates"
    python3 bench/timings.py "$build_dir"/target/cargo-timings/cargo-timing.html 8
  } >"$build_dir/build.txt"
  export RATEWATCH_BENCH_BUILD="$build_dir/build.txt"
  rm -rf "$build_dir/target"
fi

cargo bench --bench suite --no-run
timeout --kill-after=10 "${BENCH_TIMEOUT:-1200}" \
  cargo bench --bench suite -- run "$@"
