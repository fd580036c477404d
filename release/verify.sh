#!/usr/bin/env bash
# Check a release directory as a user would before installing from it:
#   release/verify.sh DIR
# the checksums, the image index (linux/amd64 and linux/arm64) in the OCI
# archive, the chart's version and appVersion, the SBOM (SPDX 2.3 naming the
# crates linked in) and the release notes. .ci/run runs it on the release
# release/release.sh builds from the clean checkout.
set -euo pipefail
dir=$(realpath "$1")
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$dir" && sha256sum --quiet -c SHA256SUMS) || fail "checksums"
for f in "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md; do
    grep -q "  $f\$" "$dir/SHA256SUMS" || fail "SHA256SUMS does not list $f"
done
echo "ok: checksums of 4 files"

# The archive's index names the release's tag and points to an image index of both platforms.
oci=$(mktemp -d)
trap 'rm -rf "$oci"' EXIT
tar -xf "$dir/drafs-$version.oci.tar" -C "$oci"
top=$(jq -r --arg v "$version" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $v) | .digest' "$oci/index.json")
[ -n "$top" ] || fail "the OCI archive has no manifest tagged $version"
platforms=$(jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture)"' "$oci/blobs/${top/://}" | sort | tr '\n' ' ')
[ "$platforms" = "linux/amd64 linux/arm64 " ] || fail "the image index lists '$platforms'"
for manifest in $(jq -r '.manifests[].digest' "$oci/blobs/${top/://}"); do
    [ -f "$oci/blobs/${manifest/://}" ] || fail "the archive lacks the manifest $manifest"
done
echo "ok: image index of $platforms"

chart=$(tar -xzOf "$dir/drafs-$version.tgz" drafs/Chart.yaml)
grep -q "^version: $version\$" <<<"$chart" || fail "the chart's version is not $version"
grep -q "^appVersion: \"\\?$version\"\\?\$" <<<"$chart" || fail "the chart's appVersion is not $version"
echo "ok: chart $version"

sbom="$dir/drafs-$version.spdx.json"
[ "$(jq -r .spdxVersion "$sbom")" = SPDX-2.3 ] || fail "the SBOM is not SPDX 2.3"
for crate in drafs kube tokio rustls; do
    jq -e --arg c "$crate" 'any(.packages[]; .name == $c)' "$sbom" >/dev/null || fail "the SBOM does not name $crate"
done
echo "ok: SBOM of $(jq '.packages | length' "$sbom") packages"

[ "$(head -n 1 "$dir/RELEASE-NOTES.md")" = "# drafs $version" ] || fail "the release notes' title"
[ "$(wc -l <"$dir/RELEASE-NOTES.md")" -gt 3 ] || fail "the release notes are empty"
echo "ok: release notes"
