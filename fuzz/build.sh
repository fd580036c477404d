#!/usr/bin/env bash
# Build every fuzz target (release, with the sanitizer cargo fuzz adds), without
# running any: `fuzz/build.sh` is the CI check that the targets still compile
# against drafs. Installs cargo-fuzz if it is missing; RUSTC_BOOTSTRAP lets the
# stable toolchain take cargo fuzz's -Z flags. Extra arguments go to
# `cargo fuzz build` (e.g. a target's name to build only that one).
#
#   fuzz/build.sh --check   type-check every target against drafs, no cargo-fuzz,
#                           no sanitizer build (what CI runs: minutes, not 13)
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = --check ]; then
    exec cargo check --locked --bins
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build --release "$@"
