#!/usr/bin/env bash
# Package the chart as a release ships it, into OUTDIR: drafs-VERSION.tgz,
# naming the image where the release publishes it (DRAFS_REGISTRY: the
# chart's image.repository becomes REGISTRY/drafs; unset: drafs). Prints the
# archive's path.
#   [DRAFS_REGISTRY=ghcr.io/drafs] [HELM=path] release/chart.sh OUTDIR
# HELM defaults to the helm of the tests' Go build (tests/go/build.sh, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
helm=${HELM:-$(tests/go/build.sh | tail -n 1)/helm}
chart=$(mktemp -d)
trap 'rm -rf "$chart"' EXIT
cp -r deploy/helm/drafs "$chart/drafs"
if [ -n "${DRAFS_REGISTRY:-}" ]; then
    sed -i "s|^  repository: drafs\$|  repository: $DRAFS_REGISTRY/drafs|" "$chart/drafs/values.yaml"
    grep -q "^  repository: $DRAFS_REGISTRY/drafs\$" "$chart/drafs/values.yaml" ||
        { echo "chart.sh: cannot set the chart's image.repository" >&2; exit 1; }
fi
mkdir -p "$out"
"$helm" package "$chart/drafs" --destination "$out" >/dev/null
[ -f "$out/drafs-$version.tgz" ] || { echo "chart.sh: helm package made no drafs-$version.tgz" >&2; exit 1; }
echo "$out/drafs-$version.tgz"
