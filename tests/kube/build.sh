#!/usr/bin/env bash
# Builds the real Kubernetes components for the kube and real-node test tiers
# from Go modules (no prebuilt binaries), at the versions go.mod pins:
# kube-apiserver, kubectl, kubelet, kube-scheduler and kube-controller-manager
# from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3, the node tier's
# DRA driver (cmd/dra-driver, the upstream test driver's kubelet plugin), and
# the Go test binary that decodes drafs's standard view with
# k8s.io/dynamic-resource-allocation. One `go build` builds them all, so the
# packages they share compile once.
#
# Output goes to a cache outside the checkout, keyed by go.mod, go.sum, the Go
# version and this script, so a second run costs nothing. The last line printed
# is the directory that holds them.
#
#   DRAFS_KUBE_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-kube)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (the kube tier needs Go 1.26+)" >&2; exit 1; }

key=$(cat go.mod go.sum build.sh cmd/*/main.go ./*_test.go 2>/dev/null | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-kube}"
out="$root/$key"
bins=(kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager etcd dra-driver metadata.test)
built() {
    for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then
    echo "$out"
    exit 0
fi

mkdir -p "$root"
# One build at a time (test processes may call this together); the others wait, then find it built.
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
echo "build.sh: building ${bins[*]} into $out (about 15 minutes the first time on 2 cores)" >&2
# Built from modules, the binaries would report v0.0.0-master+$Format:%H$,
# which kubectl and the kubelet cannot parse: stamp the pinned version.
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(cut -d. -f2 <<<"$version")
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
go build -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager ./cmd/etcd ./cmd/dra-driver
go test -c -o "$tmp/metadata.test" .
mkdir -p "$out"
for b in "${bins[@]}"; do mv "$tmp/$b" "$out/"; done
echo "$out"
