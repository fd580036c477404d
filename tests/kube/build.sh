#!/usr/bin/env bash
# Builds the real control plane for the kube test tier from Go modules (no
# prebuilt binaries): kube-apiserver from k8s.io/kubernetes and etcd from
# go.etcd.io/etcd/server/v3 at the versions go.mod pins, plus the Go test
# binary that decodes drafs's standard view with k8s.io/dynamic-resource-allocation.
#
# Output goes to a cache outside the checkout, keyed by go.mod, go.sum, the Go
# version and this script, so a second run costs nothing. The last line printed
# is the directory that holds kube-apiserver, etcd, kubectl and metadata.test.
#
#   DRAFS_KUBE_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-kube)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (the kube tier needs Go 1.26+)" >&2; exit 1; }

key=$(cat go.mod go.sum build.sh cmd/etcd/main.go ./*_test.go 2>/dev/null | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-kube}"
out="$root/$key"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -x "$out/kubectl" ] && [ -x "$out/metadata.test" ]; then
    echo "$out"
    exit 0
fi

mkdir -p "$root"
# One build at a time (test processes may call this together); the others wait, then find it built.
exec 9>"$root/.lock"
flock 9
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -x "$out/kubectl" ] && [ -x "$out/metadata.test" ]; then
    echo "$out"
    exit 0
fi
tmp=$(mktemp -d "$root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# go.sum is committed: -mod=readonly keeps the build to exactly what it records.
export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0
echo "build.sh: building kube-apiserver, etcd and kubectl into $out (slow the first time on 2 cores)" >&2
go build -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -o "$tmp/etcd" ./cmd/etcd
# kubectl from the same module: the tests apply the shipped manifests and
# kustomizations exactly as the README tells users to (server-side dry runs).
go build -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
go test -c -o "$tmp/metadata.test" .
mkdir -p "$out"
mv "$tmp/kube-apiserver" "$tmp/etcd" "$tmp/kubectl" "$tmp/metadata.test" "$out/"
echo "$out"
