#!/usr/bin/env bash
# Build a release from a clean checkout, into OUTDIR (default dist/):
#   drafs-VERSION.oci.tar        the image index (linux/amd64 + linux/arm64) as an OCI archive
#   drafs-VERSION.tgz            the packaged chart (helm package; installable by path or from an OCI registry)
#   drafs-VERSION.spdx.json      the software bill of materials of the binary (SPDX 2.3: its crates)
#   RELEASE-NOTES.md             this version's section of CHANGELOG.md
#   SHA256SUMS                   the checksums of the above
#
#   release/release.sh [OUTDIR]
#   DRAFS_REGISTRY=ghcr.io/drafs release/release.sh   the chart's image.repository: REGISTRY/drafs
#   DRAFS_RELEASE_DIRTY=1 release/release.sh   allow uncommitted changes (a try, not a release)
#
# VERSION is Cargo.toml's (tests/version.rs keeps the chart, kustomize and the
# docs at it). Publishing is the workflow's (.github/workflows/release.yml):
#   buildah manifest push --all drafs:VERSION docker://REGISTRY/drafs:VERSION
#   helm push drafs-VERSION.tgz oci://REGISTRY/charts
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
image=drafs:$version

if [ -n "$(git status --porcelain 2>/dev/null)" ] && [ "${DRAFS_RELEASE_DIRTY:-}" != 1 ]; then
    echo "release.sh: the checkout has uncommitted changes (DRAFS_RELEASE_DIRTY=1 to try anyway)" >&2
    exit 1
fi
notes=$(awk -v v="$version" '$0 ~ "^## " { if (inside) exit; inside = ($2 == v) ; next } inside' CHANGELOG.md)
[ -n "$notes" ] || { echo "release.sh: CHANGELOG.md has no section '## $version'" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"

# The image, both platforms, checked, then archived whole.
image/build.sh "$image" >/dev/null
image/check.sh "$image" >&2
buildah manifest push --quiet --all "$image" "oci-archive:$out/drafs-$version.oci.tar:$version" >/dev/null

# The chart, naming the image where the release publishes it (DRAFS_REGISTRY).
release/chart.sh "$out" >/dev/null

# The SBOM: the crates linked into the binary (normal dependencies for the
# image's targets, proc macros left out: they run at build time), as SPDX 2.3 JSON, which Trivy (`trivy sbom`) and Grype
# (`grype sbom:FILE`) read.
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    cargo tree --locked -e normal --target "$target" --prefix none --format '{p}|{l}'
done | grep -v '(proc-macro)' | sed 's/ (\*)$//; s/ ([^|]*)|/|/' | sort -u | release/spdx.sh "$version" "$(git rev-parse HEAD)" >"$out/drafs-$version.spdx.json"

{
    echo "# drafs $version"
    echo
    echo "$notes"
} >"$out/RELEASE-NOTES.md"
(cd "$out" && sha256sum "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md >SHA256SUMS)
ls -l "$out" >&2
echo "$out"
