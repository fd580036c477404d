#!/usr/bin/env bash
# Check a built image (buildah): the binary is static, `drafs --version` runs from
# the image's own root filesystem, and the image is small.
#   image/check.sh TAG
set -euo pipefail
tag=$1
# 10.35 MB on 2026-12-03 with drafs node (docs/deploy.md says what the size buys).
max_bytes=$((10500 * 1000))

ctr=$(buildah from "$tag")
trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")

files=$(cd "$root" && find . -mindepth 1 | sort | tr '\n' ' ')
[ "$files" = "./drafs " ] || { echo "FAIL: the image holds more than /drafs: $files"; exit 1; }
if readelf -l "$root/drafs" | grep -q INTERP; then
    echo "FAIL: /drafs is dynamically linked"; exit 1
fi
if readelf -d "$root/drafs" 2>/dev/null | grep -q NEEDED; then
    echo "FAIL: /drafs needs shared libraries"; exit 1
fi
echo "ok: /drafs is statically linked"

out=$(chroot --userspec=65532:65532 "$root" /drafs --version)
echo "ok: chroot $root /drafs --version -> $out"
case "$out" in drafs\ *) ;; *) echo "FAIL: unexpected version output"; exit 1 ;; esac

user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$tag")
[ "$user" = "65532:65532" ] || { echo "FAIL: default user is '$user'"; exit 1; }
echo "ok: default user $user"
title=$(buildah inspect --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.title"}}' "$tag")
[ "$title" = drafs ] || { echo "FAIL: OCI title label is '$title'"; exit 1; }
echo "ok: OCI labels"

size=$(du -sb "$root/drafs" | cut -f1)
echo "ok: image content $size bytes"
[ "$size" -lt "$max_bytes" ] || { echo "FAIL: larger than $max_bytes bytes"; exit 1; }
