#!/usr/bin/env bash
# Builds the real node for drafs's real-node test tier from Go modules (no
# prebuilt binaries): containerd, containerd-shim-runc-v2 and ctr at the
# version go.mod pins, and the sandbox's pause program. The Kubernetes
# components (kubelet, kube-scheduler, kube-controller-manager, the DRA driver)
# come from tests/kube/build.sh, built in the same go build as the kube tier's.
# runc, the CNI plugins, busybox and buildah come from Debian (see .ci/run).
#
# Output goes to a cache outside the checkout, keyed by go.mod, go.sum, the
# pause source, the Go version and this script. The last two lines printed are
# the directory of the Kubernetes binaries, then this one's.
#
#   DRAFS_NODE_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-node)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (the real-node tier needs Go 1.26+)" >&2; exit 1; }
kube=$(bash "$here/../kube/build.sh" | tail -n 1)

key=$(cat go.mod go.sum build.sh cmd/pause/main.go | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-node}"
out="$root/$key"
bins=(containerd containerd-shim-runc-v2 ctr pause)
built() {
    for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if ! built; then
    mkdir -p "$root"
    exec 9>"$root/.lock"
    flock 9
    if ! built; then
        tmp=$(mktemp -d "$root/.build.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        export GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=0
        echo "build.sh: building ${bins[*]} into $out (a few minutes the first time on 2 cores)" >&2
        tags="urfave_cli_no_docs osusergo netgo static_build"
        go build -tags "$tags" -ldflags "-s -w" -o "$tmp/" \
            github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr ./cmd/pause
        go build -tags "$tags no_grpc" -ldflags "-s -w" -o "$tmp/" \
            github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
        mkdir -p "$out"
        for b in "${bins[@]}"; do mv "$tmp/$b" "$out/"; done
    fi
fi
echo "$kube"
echo "$out"
