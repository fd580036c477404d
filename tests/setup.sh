#!/usr/bin/env bash
# Everything the tests need on a fresh machine with Rust stable and Go 1.26+
# (the README's second set-up command; .ci/run calls it too):
#   - Debian packages, when missing and we are root: openssl (certificates),
#     util-linux (unshare, nsenter), buildah, musl-tools, binutils,
#     gcc-aarch64-linux-gnu and qemu-user-static (the image, amd64 and arm64),
#     jq (the kubevirt-launcher example), and for the real node runc,
#     the CNI plugins, busybox and iproute2;
#   - the Rust build of drafs;
#   - the Kubernetes components, etcd, containerd, helm and the DRA test
#     driver, built from one Go module into a cache outside the checkout
#     (tests/go/build.sh), then cosign and an OCI registry for the release's
#     tests (tests/go/build.sh release) and Prometheus's parsers for the
#     chart's alerts (tests/go/build.sh prom); kube-apiserver v1.34, for the kube
#     tier's second run in CI, is built by .ci/run (or on first use);
#   - the images the real node's pods run (tests/node/images.sh).
# Each step is skipped when already done, so a second run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

need=()
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v musl-gcc >/dev/null 2>&1 || need+=(musl-tools)
command -v readelf >/dev/null 2>&1 || need+=(binutils)
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The image's second platform: arm64's linker, and qemu-user to run it here.
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "setup: install these Debian packages (or their equivalents) first: ${need[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v go >/dev/null 2>&1 || { echo "setup: Go 1.26+ is needed for the kube and real-node tiers" >&2; exit 1; }

# The Go programs, the longest step, build beside the Rust builds: each has
# stretches on one core (linking; the image's single LTO codegen unit) that
# the other fills.
go_out=$(mktemp)
trap 'rm -f "$go_out"' EXIT
# Then cosign and the registry the release's tests run (tests/release.sh,
# tests/kube_release.rs).
{ tests/go/build.sh >"$go_out" && tests/go/build.sh release >/dev/null && tests/go/build.sh prom >/dev/null; } &
go_build=$!
cargo build --all-targets
# The shipped image (tests/node/images.sh below finds it built).
DRAFS_PLATFORMS=$(tests/node/platform.sh) image/build.sh drafs:realnode >/dev/null
echo "setup: drafs and its image built after $((SECONDS - start)) s" >&2
wait "$go_build" || { echo "setup: tests/go/build.sh failed" >&2; exit 1; }
bin=$(tail -n 1 "$go_out")
echo "setup: Kubernetes components and containerd ready after $((SECONDS - start)) s" >&2
tests/node/images.sh "${DRAFS_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drafs-node}/images" "$bin/pause"
echo "setup: done after $((SECONDS - start)) s" >&2
