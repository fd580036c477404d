#!/usr/bin/env bash
# Package the chart as a release ships it, into OUTDIR: drafs-VERSION.tgz,
# naming the image where the release publishes it (DRAFS_REGISTRY: the
# chart's image.repository becomes REGISTRY/drafs; unset: drafs). Prints the
# archive's path.
#   [DRAFS_REGISTRY=ghcr.io/drafs] [HELM=path] release/chart.sh OUTDIR
# OUTDIR is relative to the caller's directory, made if missing; an archive of
# the same name there is refused, not replaced. HELM defaults to the helm of
# the tests' Go build (tests/go/build.sh, cached).
set -euo pipefail
out=${1:?usage: release/chart.sh OUTDIR}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/.."
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
[ ! -e "$out/drafs-$version.tgz" ] || { echo "chart.sh: $out/drafs-$version.tgz exists" >&2; exit 1; }
"$helm" package "$chart/drafs" --destination "$chart" >/dev/null
[ -f "$chart/drafs-$version.tgz" ] || { echo "chart.sh: helm package made no drafs-$version.tgz" >&2; exit 1; }
mkdir -p "$out"
mv -n "$chart/drafs-$version.tgz" "$out/"
echo "$out/drafs-$version.tgz"
