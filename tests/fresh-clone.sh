#!/usr/bin/env bash
# Fresh clone to green, timed: clones this checkout's HEAD into a scratch
# directory and runs the README's two set-up commands and its test command
# (read from the README's first sh block, as tests/readme.rs reads them)
# there with every cache empty (Cargo's registry and installs, Go's build and
# module caches, the tiers' caches under XDG_CACHE_HOME), printing how long
# each took. Debian packages already installed stay installed.
#
#   tests/fresh-clone.sh [SCRATCH]      (default /tmp/drafs-fresh, emptied first)
#   tests/fresh-clone.sh SCRATCH ci     the whole of .ci/run instead, timed (CI's 90 minutes)
#
# Its logs stay in SCRATCH (nextest.log, setup.log, suite.log).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
scratch=${1:-/tmp/drafs-fresh}
what=${2:-readme}
rm -rf "$scratch"
mkdir -p "$scratch"
git clone -q "$here" "$scratch/drafs"
cd "$scratch/drafs"

# A PATH without the cargo-nextest already installed here (cargo finds
# subcommands on PATH), with the toolchain's cargo and rustc.
# rustup stays reachable (CI adds the arm64 target with it) by a link of its own.
toolchain=$(dirname "$(rustup which cargo 2>/dev/null || command -v cargo)")
mkdir -p "$scratch/bin"
if command -v rustup >/dev/null; then ln -s "$(command -v rustup)" "$scratch/bin/rustup"; fi
path=$scratch/cargo-home/bin:$scratch/bin:$toolchain
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    [ -x "$d/cargo-nextest" ] || path=$path:$d
done
export PATH=$path CARGO_HOME=$scratch/cargo-home XDG_CACHE_HOME=$scratch/cache
export GOCACHE=$scratch/go-build GOMODCACHE=$scratch/go-mod
unset CARGO_TARGET_DIR DRAFS_NODE_IMAGES

step() { # name log command...
    local name=$1 log=$2 start=$SECONDS
    shift 2
    "$@" >"$scratch/$log" 2>&1
    local rc=$?
    echo "$name: $((SECONDS - start)) s (exit $rc, $scratch/$log)"
    return $rc
}
# The README's commands: set-up, set-up, the tree, the tests.
mapfile -t commands < <(awk '/^```sh$/ { inside = 1; next } inside && /^```$/ { exit } inside' README.md |
    sed 's/ # .*//; s/^ *//; s/ *$//' | grep -v -e '^#' -e '^$')
[ ${#commands[@]} = 4 ] || { echo "fresh-clone.sh: the README's sh block has ${#commands[@]} commands, not 4" >&2; exit 2; }
start=$SECONDS
echo "fresh clone of $(git rev-parse --short HEAD) in $scratch, $(nproc) cores"
if [ "$what" = ci ]; then
    step .ci/run ci.log .ci/run
    rc=$?
    grep '^CI: ' "$scratch/ci.log"
    echo "fresh clone through .ci/run: $((SECONDS - start)) s (exit $rc)"
    exit $rc
fi
step "${commands[0]}" nextest.log bash -c "${commands[0]}"
step "${commands[1]}" setup.log bash -c "${commands[1]}"
step "${commands[3]}" suite.log bash -c "${commands[3]}"
rc=$?
echo "fresh clone to green: $((SECONDS - start)) s (the suite exited $rc)"
exit $rc
