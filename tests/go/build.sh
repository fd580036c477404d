#!/usr/bin/env bash
# Builds every Go program the test tiers run, from the Go modules here (no
# prebuilt binaries), at the versions go.mod pins:
#
#   tests/go/build.sh         the module in this directory: kube-apiserver,
#                             kubectl, kubelet, kube-scheduler and
#                             kube-controller-manager (k8s.io/kubernetes), etcd,
#                             dra-driver (the upstream DRA test driver's kubelet
#                             plugin), containerd, ctr, containerd-shim-runc-v2,
#                             pause, helm, and metadata.test (the upstream
#                             decoder of the standard view)
#   tests/go/build.sh v1.34   kube-apiserver v1.34 (v1.34/go.mod), for the kube
#                             tier's run against the oldest version (CI)
#   tests/go/build.sh release cosign (github.com/sigstore/cosign/v3) and an OCI
#                             registry (CNCF Distribution, cmd/registry here:
#                             release/go.mod), for signing and verifying the
#                             release (tests/release.sh, the release workflow)
#   tests/go/build.sh prom    promcheck (prom/): Prometheus's own parsers of the
#                             text format and of PromQL, for the chart's alerts
#                             and dashboard (tests/kube_monitoring.rs)
#
# One `go build` builds the first set, so the packages they share (k8s.io/api,
# client-go, grpc, protobuf, otel...) compile once.
#
# Output goes to a cache outside the checkout, keyed by the module's files, the
# Go version and this script, so a second run costs nothing. The last line
# printed is the directory that holds the binaries. One build at a time: test
# processes may call this together; the others wait, then find it built.
#
#   DRAFS_GO_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/drafs-go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
script="$here/build.sh"

case "${1:-}" in
"") name=tests module="$here" takes="15-20 minutes"
    bins=(kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager etcd dra-driver
        containerd ctr containerd-shim-runc-v2 pause helm metadata.test) ;;
v1.34) name=v1.34 module="$here/v1.34" takes="6-7 minutes" bins=(kube-apiserver) ;;
release) name=release module="$here/release" takes="5-12 minutes" bins=(cosign registry) ;;
prom) name=prom module="$here/prom" takes="1-2 minutes" bins=(promcheck) ;;
*) echo "usage: tests/go/build.sh [v1.34|release|prom]" >&2; exit 2 ;;
esac
cd "$module"

command -v go >/dev/null || { echo "build.sh: go is not installed (the kube and real-node tiers need Go 1.26+)" >&2; exit 1; }

sources=$(find . \( -path ./v1.34 -o -path ./release -o -path ./prom \) -prune -o -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print | sort)
# shellcheck disable=SC2086 # the file names have no spaces
key=$(cat $sources "$script" | cat - <(go version) | sha256sum | cut -c1-16)
root="${DRAFS_GO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-go}"
out="$root/$name-$key"
built() {
    for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then
    echo "$out"
    exit 0
fi
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if built; then
    echo "$out"
    exit 0
fi
tmp=$(mktemp -d "$root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# go.sum is committed: -mod=readonly keeps the build to exactly what it records.
export GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=0
started=$SECONDS
echo "build.sh: building ${bins[*]} into $out ($takes the first time on 2 cores)" >&2
case $name in
release)
    # `cosign version` says the version go.mod pins, as upstream's release does.
    cosign=$(go list -m -f '{{.Version}}' github.com/sigstore/cosign/v3)
    go build -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$cosign" -o "$tmp/" \
        github.com/sigstore/cosign/v3/cmd/cosign ./cmd/registry
    ;;
prom)
    go build -ldflags "-s -w" -o "$tmp/promcheck" .
    ;;
v1.34|tests)
    # Built from modules, the Kubernetes binaries would report
    # v0.0.0-master+$Format:%H$, which kubectl and the kubelet cannot parse: stamp
    # the pinned versions (helm's too). -X for a package a binary lacks is ignored.
    kube=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
    v=k8s.io/component-base/version
    ldflags="-s -w -X $v.gitVersion=$kube -X $v.gitMajor=1 -X $v.gitMinor=$(cut -d. -f2 <<<"$kube") -X $v.gitTreeState=clean"
    if [ "$name" = v1.34 ]; then
        go build -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver
    else
        helm=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
        ldflags="$ldflags -X helm.sh/helm/v4/internal/version.version=$helm"
        # containerd's static build tags; they change nothing in the other programs.
        tags="urfave_cli_no_docs osusergo netgo static_build"
        go build -tags "$tags" -ldflags "$ldflags" -o "$tmp/" \
            k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
            k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
            ./cmd/etcd ./cmd/dra-driver ./cmd/pause \
            github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
            helm.sh/helm/v4/cmd/helm
        # The shim without its gRPC server (ttrpc only), as containerd ships it.
        go build -tags "$tags no_grpc" -ldflags "-s -w" -o "$tmp/" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
        go test -c -o "$tmp/metadata.test" .
    fi
    ;;
esac
mkdir -p "$out"
for b in "${bins[@]}"; do mv "$tmp/$b" "$out/"; done
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$out"
