#!/usr/bin/env bash
# Build a release from a clean checkout, into OUTDIR (default: the checkout's
# dist/), a directory this script makes, or an empty one:
#   drafs-VERSION.oci.tar        the image index (linux/amd64 + linux/arm64) as an OCI archive;
#                                each image's binary carries its crates (cargo auditable)
#   drafs-VERSION.tgz            the packaged chart (helm package; installable by path or from an OCI registry)
#   drafs-VERSION.spdx.json      the software bill of materials of the binaries (SPDX 2.3: their crates)
#   RELEASE-NOTES.md             this version's section of CHANGELOG.md
#   SHA256SUMS                   the checksums of the above
#
#   release/release.sh [OUTDIR]                  OUTDIR relative to the caller's directory
#   DRAFS_REGISTRY=ghcr.io/drafs release/release.sh   the chart's image.repository: REGISTRY/drafs
#   DRAFS_RELEASE_DIRTY=1 release/release.sh   allow uncommitted changes (a try, not a release)
#
# It refuses an OUTDIR that exists and is not an empty directory, and a
# checkout whose state or commit git cannot tell (a clone git does not trust
# is not a clean one). Everything is built beside OUTDIR in a directory of its
# own and moved in at the end: a failed run leaves nothing in OUTDIR (and
# removes OUTDIR if it made it), and it never removes what it did not make.
#
# VERSION is Cargo.toml's (tests/version.rs keeps the chart, kustomize and the
# docs at it). Publishing and signing are release/publish.sh's, which the
# release workflow runs (.github/workflows/release.yml) and tests/release.sh
# runs against a registry on loopback; release/verify.sh checks the result.
set -euo pipefail
fail() { echo "release.sh: $*" >&2; exit 1; }
[ $# -le 1 ] || fail "usage: release/release.sh [OUTDIR]"
repo_root=$(cd "$(dirname "$0")/.." && pwd)
# OUTDIR as the caller meant it: relative to the caller's directory.
out=${1:-$repo_root/dist}
case $out in /*) ;; *) out=$PWD/$out ;; esac
out=$(realpath -m -- "$out")
if [ -e "$out" ] || [ -L "$out" ]; then
    if [ ! -d "$out" ] || [ -L "$out" ]; then fail "$out exists and is not a directory"; fi
    [ -z "$(ls -A -- "$out")" ] || fail "$out is not empty: give a new or an empty directory (nothing in it is removed)"
fi
parent=$(dirname "$out")
[ -d "$parent" ] || fail "$parent does not exist"
cd "$repo_root"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || fail "no version in Cargo.toml"
image=drafs:$version

# The tree's state and its commit, from git, or no release: a failure to ask
# (a clone git does not trust, no git) is not a clean tree.
status=$(git status --porcelain 2>&1) || fail "git cannot tell the checkout's state: $status"
commit=$(git rev-parse --verify 'HEAD^{commit}' 2>&1) || fail "git cannot tell the commit: $commit"
[[ $commit =~ ^[0-9a-f]{40}$ ]] || fail "git gave '$commit' for the commit"
if [ -n "$status" ] && [ "${DRAFS_RELEASE_DIRTY:-}" != 1 ]; then
    fail "the checkout has uncommitted changes (DRAFS_RELEASE_DIRTY=1 to try anyway)"
fi
notes=$(awk -v v="$version" '$0 ~ "^## " { if (inside) exit; inside = ($2 == v) ; next } inside' CHANGELOG.md)
[ -n "$notes" ] || fail "CHANGELOG.md has no section '## $version'"

# Built beside OUTDIR, in a directory of ours; moved in at the end.
stage=$(mktemp -d "$parent/.drafs-release.XXXXXX")
made_out=0 moved=()
cleanup() {
    rm -rf -- "$stage"
    # On a failure after the move began: the files this run moved in, and
    # OUTDIR if this run made it (rmdir: only while empty).
    local f
    for f in "${moved[@]}"; do rm -f -- "$out/$f"; done
    [ "$made_out" = 0 ] || rmdir -- "$out" 2>/dev/null || true
}
trap cleanup EXIT

# The image, both platforms, checked, then archived whole.
binaries=$(image/build.sh "$image" | cut -d' ' -f2)
image/check.sh "$image" >&2
buildah manifest push --quiet --all "$image" "oci-archive:$stage/drafs-$version.oci.tar:$version" >/dev/null

# The chart, naming the image where the release publishes it (DRAFS_REGISTRY).
release/chart.sh "$stage" >/dev/null

# The SBOM: the crates the binaries record they were built from (cargo
# auditable's list in their .dep-v0 section, which scanners read in the image:
# crates reached only through build dependencies left out, proc macros that
# runtime crates use kept, as cargo resolved them), with the licenses their
# Cargo.toml declare, as SPDX 2.3 JSON, which Trivy (`trivy sbom`), Grype
# (`grype sbom:FILE`) and cosign attestations take.
licenses=$(cargo metadata --locked --format-version 1 \
    --filter-platform x86_64-unknown-linux-musl --filter-platform aarch64-unknown-linux-musl | jq -r '.packages[] | "\(.name) \(.version)|\(.license // "")"')
for bin in $binaries; do
    release/auditable.sh "$bin"
done | sort -u | awk -F'|' 'NR == FNR { license[$1] = $2; next } { print $0 "|" license[$0] }' <(echo "$licenses") - |
    sed 's/^\([^ ]*\) /\1 v/' | release/spdx.sh "$version" "$commit" >"$stage/drafs-$version.spdx.json"

{
    echo "# drafs $version"
    echo
    echo "$notes"
} >"$stage/RELEASE-NOTES.md"
(cd "$stage" && sha256sum "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md >SHA256SUMS)

# Into OUTDIR: made now (refused if it appeared since), or the empty one given.
if [ ! -e "$out" ]; then
    mkdir -- "$out"
    made_out=1
fi
[ -z "$(ls -A -- "$out")" ] || fail "$out is no longer empty"
for f in "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md SHA256SUMS; do
    [ ! -e "$out/$f" ] || fail "$out/$f appeared while the release was built"
    mv -n -- "$stage/$f" "$out/$f"
    moved+=("$f")
done
made_out=0 moved=()
ls -l "$out" >&2
echo "$out"
