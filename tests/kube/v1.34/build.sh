#!/usr/bin/env bash
# Builds kube-apiserver at Kubernetes v1.34.4 (the oldest release serving
# resource.k8s.io/v1) from the k8s.io/kubernetes Go module (no prebuilt
# binaries), at the version go.mod pins, so the kube tier can also run against
# 1.34. Only the apiserver: etcd, kubectl and the other components come from
# ../build.sh.
#
# Output goes to a cache outside the checkout, keyed by go.mod, go.sum, the Go
# version and this script, so a second run costs nothing. The last line printed
# is the directory that holds it.
#
#   DRAFS_KUBE_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-kube)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (the kube tier needs Go 1.26+)" >&2; exit 1; }

key=$(cat go.mod go.sum build.sh | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-kube}"
out="$root/v1.34-$key"
bins=(kube-apiserver)
built() {
    for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then
    echo "$out"
    exit 0
fi

mkdir -p "$root"
# One build at a time (test processes may call this together, and ../build.sh
# shares the lock); the others wait, then find it built.
exec 9>"$root/.lock"
flock 9
if built; then
    echo "$out"
    exit 0
fi
tmp=$(mktemp -d "$root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# go.sum is committed: -mod=readonly keeps the build to exactly what it records.
export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0
echo "build.sh: building ${bins[*]} v1.34 into $out (about 10 minutes the first time on 2 cores)" >&2
# Built from modules, the binary would report v0.0.0-master+$Format:%H$:
# stamp the pinned version.
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(cut -d. -f2 <<<"$version")
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
go build -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver
mkdir -p "$out"
for b in "${bins[@]}"; do mv "$tmp/$b" "$out/"; done
echo "$out"
