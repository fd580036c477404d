#!/usr/bin/env bash
# The crates a binary built with `cargo auditable` records it was built from:
# the JSON in its .dep-v0 section (zlib), which Trivy, Grype, Syft and
# `cargo audit bin` read. Prints "NAME VERSION" per crate linked in (build
# dependencies and proc macros left out: they run at build time), drafs
# itself left out; with --json, the whole record. Fails when the binary
# carries none.
#   release/auditable.sh [--json] BINARY
set -euo pipefail
json=0
[ "${1:-}" != --json ] || { json=1; shift; }
bin=${1:?usage: release/auditable.sh [--json] BINARY}
# readelf reads every architecture's ELF (objcopy only its own).
# Its line: [Nr] Name Type Address Off Size ...
read -r offset size < <(readelf -W -S "$bin" | sed 's/^ *\[ *[0-9]*\] *//' | awk '$1 == ".dep-v0" { print $4, $5 }') ||
    { echo "auditable.sh: $bin has no .dep-v0 section (not built with cargo auditable)" >&2; exit 1; }
offset=$((16#$offset)) size=$((16#$size))
# Read in one process: a pipeline of tail and head fails now and then under
# pipefail (tail killed by SIGPIPE when head has read its part).
record=$(python3 -c 'import sys, zlib
with open(sys.argv[1], "rb") as f:
    f.seek(int(sys.argv[2]))
    sys.stdout.write(zlib.decompress(f.read(int(sys.argv[3]))).decode())' "$bin" "$offset" "$size") ||
    { echo "auditable.sh: the .dep-v0 section of $bin does not decompress" >&2; exit 1; }
if [ "$json" = 1 ]; then
    jq . <<<"$record"
else
    jq -r '.packages[] | select((.kind // "runtime") == "runtime" and (.root | not)) | "\(.name) \(.version)"' <<<"$record" | sort -u
fi
