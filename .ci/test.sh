#!/usr/bin/env bash
# Runs every ratewatch check: formatting, lints, unit, property,
# integration (real redis-server, Redis Cluster, Prometheus, Chromium)
# and doc tests. Installs the servers the tests start when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The lean library an embedding app gets with default-features = false.
cargo clippy --lib --no-default-features -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast --config-file .ci/nextest.toml
else
  cargo test --no-fail-fast --lib --bins --tests
fi
cargo test --doc
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps
