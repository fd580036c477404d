#!/usr/bin/env bash
# Builds helm from its Go module (helm.sh/helm/v4, the version go.mod pins)
# for the kube tier's chart tests (tests/helm.rs). Output goes to a cache
# outside the checkout, keyed by go.mod, go.sum, the Go version and this
# script; the last line printed is the directory that holds `helm`.
#
#   DRAFS_HELM_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-helm)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (the chart tests need Go 1.26+)" >&2; exit 1; }

key=$(cat go.mod go.sum build.sh | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-helm}"
out="$root/$key"
if [ -x "$out/helm" ]; then
    echo "$out"
    exit 0
fi
mkdir -p "$root"
# One build at a time; the others wait, then find it built.
exec 9>"$root/.lock"
flock 9
if [ -x "$out/helm" ]; then
    echo "$out"
    exit 0
fi
tmp=$(mktemp -d "$root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
echo "build.sh: building helm $version into $out (a few minutes the first time on 2 cores)" >&2
go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm
mkdir -p "$out"
mv "$tmp/helm" "$out/"
echo "$out"
