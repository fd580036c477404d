#!/usr/bin/env bash
# The images the real-node tier's pods run, built locally with buildah (no
# registry, no pull) and exported as docker archives that the node's
# containerd imports:
#   drafs.tar  drafs:realnode           image/build.sh's image (the shipped one)
#   pause.tar  registry.k8s.io/pause:drafs   the sandbox image (tests/go/cmd/pause)
#   shell.tar  drafs-test/shell:1       busybox and jq for the app containers, and
#                                      stand-ins for the programs examples/ start
#
#   tests/node/images.sh OUTDIR PAUSE_BIN
# The pause and shell archives are kept between runs when their inputs did not
# change; drafs's is rebuilt (image/build.sh is incremental).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=$1 pause=$2
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

export_image() { # image archive name
    rm -f "$2.tmp"
    buildah push --quiet "$1" "docker-archive:$2.tmp:$3" >/dev/null
    mv "$2.tmp" "$2"
}

# drafs, exactly as CI and users build it, for this machine's platform only.
built=$(DRAFS_PLATFORMS=$("$here/platform.sh") bash "$here/../../image/build.sh" drafs:realnode)
bin=$(tail -n 1 <<<"$built" | awk '{print $2}')
stamp=$(cd "$here/../.." && sha256sum "$bin" image/Containerfile | sha256sum | cut -c1-16)
if [ "$(cat "$out/drafs.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$out/drafs.tar" ]; then
    export_image drafs:realnode "$out/drafs.tar" drafs:realnode
    echo "$stamp" >"$out/drafs.stamp"
fi

stamp=$(sha256sum "$pause" /bin/busybox "$(command -v jq)" "$0" | sha256sum | cut -c1-16)
if [ "$(cat "$out/base.stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$out/pause.tar" ] && [ -f "$out/shell.tar" ]; then
    exit 0
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

c=$(buildah from scratch)
buildah copy --quiet "$c" "$pause" /pause >/dev/null
buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
buildah commit --quiet "$c" registry.k8s.io/pause:drafs >/dev/null
buildah rm "$c" >/dev/null
export_image registry.k8s.io/pause:drafs "$out/pause.tar" registry.k8s.io/pause:drafs

# The shell image: busybox (static) with its applets, and jq with the shared
# libraries it links (the KubeVirt-shaped launcher example reads JSON with it).
root=$ctx/root
mkdir -p "$root/bin" "$root/usr/bin" "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
cp "$(command -v jq)" "$root/usr/bin/jq"
for lib in $(ldd "$(command -v jq)" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# Stand-ins for the programs the examples start (KubeVirt's launcher, a
# trainer, an allreduce job), so examples/ run unchanged: each prints its
# arguments and the variables drafs can set, then sleeps.
mkdir -p "$root/opt"
printf '#!/bin/sh\necho "${0##*/} $*"\nenv | grep -E "^(GPU|NIC|NCCL)_" | sort\nexec sleep 3600\n' >"$root/usr/bin/stand-in"
chmod 755 "$root/usr/bin/stand-in"
for p in /usr/bin/virt-launcher /usr/bin/python /opt/run-allreduce; do ln -s /usr/bin/stand-in "$root$p"; done
chmod 1777 "$root/tmp"
c=$(buildah from scratch)
buildah copy --quiet "$c" "$root" / >/dev/null
buildah config --env PATH=/bin:/usr/bin --cmd '["/bin/sh"]' "$c"
buildah commit --quiet "$c" drafs-test/shell:1 >/dev/null
buildah rm "$c" >/dev/null
export_image drafs-test/shell:1 "$out/shell.tar" drafs-test/shell:1
echo "$stamp" >"$out/base.stamp"
