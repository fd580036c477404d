#!/usr/bin/env bash
# The fast tier (.config/nextest.toml's `fast` profile: no cluster, no Go)
# against the arm64 build of drafs, run by qemu-user on an x86-64 machine:
#   tests/arm64.sh [nextest options, e.g. --no-fail-fast]
# The test programs stay native (x86-64); the drafs binary they start is
# arm64's. DRAFS_BIN (tests/support/process.rs) points them at a wrapper that
# runs it with qemu-aarch64-static, so no binfmt_misc registration (a change
# to the host CI may not make) is needed. Needs the aarch64-unknown-linux-musl
# target (rustup target add) and tests/setup.sh's gcc-aarch64-linux-gnu and
# qemu-user-static; .ci/run calls it after the arm64 unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

qemu=$(command -v qemu-aarch64-static) || { echo "arm64: qemu-aarch64-static is missing (tests/setup.sh installs qemu-user-static)" >&2; exit 1; }

# The arm64 binary (the linker and runner: .cargo/config.toml).
bin=$(cargo build --locked --target aarch64-unknown-linux-musl --bin drafs --message-format=json-render-diagnostics |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable' | tail -n 1)
[ -x "$bin" ] || { echo "arm64: no arm64 drafs built" >&2; exit 1; }
echo "arm64: $bin built after $((SECONDS - start)) s" >&2

# The wrapper. qemu is started through a link named drafs: the kernel names a
# process after the file it executes, and tests look for the process (and its
# threads) by that name. Everything is world-readable: one test runs a copy of
# the binary (this wrapper) as an unprivileged user. Paths are absolute: the
# tests clear the environment (PATH too) of the drafs they start.
wrap=$(mktemp -d)
trap 'rm -rf "$wrap"' EXIT
chmod 755 "$wrap"
mkdir -m 755 "$wrap/qemu"
ln -s "$qemu" "$wrap/qemu/drafs"
printf '#!/bin/sh\nexec %q %q "$@"\n' "$wrap/qemu/drafs" "$bin" >"$wrap/drafs"
chmod 755 "$wrap/drafs"
"$wrap/drafs" --version >/dev/null

# What the fast tier holds that this run leaves out, and why:
skip=(
    # The unit tests (the lib, and the bin's): `cargo test --lib --target
    # aarch64-unknown-linux-musl` runs them on arm64 already; here they would
    # be the x86-64 build again.
    'binary(drafs)'
    # In-process only (they link the x86-64 lib and never start the binary):
    # nothing of arm64 to test.
    'binary(csi)'
    'binary(robustness)'
    # copy-self copies the running binary (/proc/self/exe, which qemu-user
    # answers with the arm64 binary) and these tests then run the copy
    # themselves, not through DRAFS_BIN: an x86-64 kernel runs an arm64
    # binary only with qemu registered in binfmt_misc ("Exec format error").
    'test(=copy_self_installs_a_runnable_copy)'
    'test(=exec_wrapper_example)'
    # Signals drafs once /proc/<pid>/status says it catches SIGTERM; qemu-user
    # catches every signal from its first instruction, so the signal can come
    # before drafs has its handler and kill it (exit 143, 1 in 20 tries).
    'test(=a_signal_stops_inject_waiting_for_standard_input_like_any_command)'
    # Expects more than 50 reads in a 1 s window whose first read also runs
    # `drafs probe`: natively instant, under qemu 0.2 s and more under load
    # (48 reads once), the test's timing, not an arm64 fault.
    'test(=a_pool_republished_slice_by_slice_keeps_serving_its_last_complete_generation)'
)
filter="not ($(IFS='|'; echo "${skip[*]}"))"
filter=${filter//|/ | }

status=0
DRAFS_BIN="$wrap/drafs" cargo nextest run --locked --profile fast -E "$filter" "$@" || status=$?
echo "arm64: fast tier under qemu-user $( [ $status = 0 ] && echo passed || echo FAILED) after $((SECONDS - start)) s" >&2
exit $status
