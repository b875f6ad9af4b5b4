#!/usr/bin/env bash
# Builds the web page's WebAssembly and JavaScript glue into web/pkg/ (run from anywhere).
# Needs the wasm32 target (`rustup target add wasm32-unknown-unknown`) and wasm-bindgen-cli at
# the version in Cargo.lock (`cargo install wasm-bindgen-cli --version <it>`); this script
# checks the version and says which to install. Serve web/ with any static server, e.g.
# `python3 -m http.server -d web 8080`, and open http://localhost:8080/ in a browser with WebGPU.
# WEB_BUILD_INSTALL=1 (.ci/run) installs that wasm-bindgen-cli instead of failing; WEB_BUILD_LINT=1
# (.ci/run) lints the wasm-only code with clippy and fails on any warning; WEB_BUILD_PROFILE: below.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ] && [ "${WEB_BUILD_INSTALL:-}" = 1 ]; then
  # Not --locked: its lock names a webpki-roots release this machine's crates mirror lacks.
  cargo install -q wasm-bindgen-cli --version "$want"
elif [ "$have" != "$want" ]; then
  echo "web/build.sh: wasm-bindgen-cli $want is needed (found: ${have:-none}); run: cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
if [ "${WEB_BUILD_LINT:-}" = 1 ]; then
  # As .ci/run lints the native build: clippy on vramfit's code, any warning fails.
  export RUSTC_WORKSPACE_WRAPPER="$PWD/.ci/clippy-rustc"
fi
# WEB_BUILD_PROFILE picks the cargo profile: release (the default, the page people open) or
# web-test (Cargo.toml: opt-level 1, what .ci/run's browser test builds in less time).
profile=${WEB_BUILD_PROFILE:-release}
# Without vramfit's default `autotune` feature: cubecl issue 1641 (Cargo.toml, wasm32 dependencies).
cargo rustc --profile "$profile" --no-default-features --lib --target wasm32-unknown-unknown --crate-type cdylib
wasm-bindgen --target web --no-typescript --out-dir web/pkg "target/wasm32-unknown-unknown/$profile/vramfit.wasm"
echo "web/pkg: $(du -sh web/pkg | cut -f1)"
