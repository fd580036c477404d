#!/usr/bin/env bash
# Build every fuzz target (release, with the sanitizer cargo fuzz adds), without
# running any: `fuzz/build.sh` is the CI check that the targets still compile
# against drafs. Installs cargo-fuzz if it is missing; RUSTC_BOOTSTRAP lets the
# stable toolchain take cargo fuzz's -Z flags. Extra arguments go to
# `cargo fuzz build` (e.g. a target's name to build only that one).
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build --release "$@"
