#!/usr/bin/env bash
# Check a built image (buildah): each platform's binary is static and of its
# architecture, `drafs --version` runs as the image's user (arm64 under
# qemu-user on an x86-64 machine) and says the version and commit of the
# image's labels, and the image is small.
#   image/check.sh TAG     TAG: the index image/build.sh made (every platform
#                          it lists, amd64 and arm64 both required), or one image
set -euo pipefail
tag=$1
# 11.35 MB (amd64) on 2026-12-07 with the NRI plugin (docs/deploy.md says
# what the size buys); arm64 is measured against the same limit.
max_bytes=$((12000 * 1000))
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml" | head -n 1)

elf_machine() { # arch -> readelf's Machine
    case $1 in amd64) echo "Advanced Micro Devices X86-64" ;; arm64) echo AArch64 ;; *) echo "?" ;; esac
}

# Run the image's binary as its user: natively in a chroot of its root, or
# under qemu-user when the machine is another architecture.
run_version() { # arch root
    local native
    native=$(uname -m)
    if { [ "$1" = amd64 ] && [ "$native" = x86_64 ]; } || { [ "$1" = arm64 ] && [ "$native" = aarch64 ]; }; then
        chroot --userspec=65532:65532 "$2" /drafs --version
        return
    fi
    local qemu=qemu-aarch64-static
    [ "$1" = arm64 ] || qemu=qemu-x86_64-static
    command -v "$qemu" >/dev/null 2>&1 || { echo "FAIL: $qemu is needed to run the $1 binary here (apt-get install qemu-user-static)" >&2; return 1; }
    local dir
    dir=$(mktemp -d)
    chmod 755 "$dir"
    cp "$2/drafs" "$dir/drafs"
    local status=0
    setpriv --reuid=65532 --regid=65532 --clear-groups "$qemu" "$dir/drafs" --version || status=$?
    rm -rf "$dir"
    return $status
}

# In a subshell: its EXIT trap removes the working container.
check_image() ( # image arch
    set -euo pipefail
    local image=$1 arch=$2 ctr root
    ctr=$(buildah from "$image")
    trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    root=$(buildah mount "$ctr")
    echo "== $image (linux/$arch)"

    local files
    files=$(cd "$root" && find . -mindepth 1 | sort | tr '\n' ' ')
    [ "$files" = "./drafs " ] || { echo "FAIL: the image holds more than /drafs: $files"; return 1; }
    if readelf -l "$root/drafs" | grep -q INTERP; then
        echo "FAIL: /drafs is dynamically linked"; return 1
    fi
    if readelf -d "$root/drafs" 2>/dev/null | grep -q NEEDED; then
        echo "FAIL: /drafs needs shared libraries"; return 1
    fi
    echo "ok: /drafs is statically linked"
    local machine
    machine=$(readelf -h "$root/drafs" | sed -n 's/^ *Machine: *//p')
    [ "$machine" = "$(elf_machine "$arch")" ] || { echo "FAIL: /drafs is built for $machine, not $arch"; return 1; }
    local config
    config=$(buildah inspect --format '{{.OCIv1.OS}}/{{.OCIv1.Architecture}}' "$image")
    [ "$config" = "linux/$arch" ] || { echo "FAIL: the image says it is $config"; return 1; }
    echo "ok: $machine binary, image config $config"

    local revision out
    revision=$(buildah inspect --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.revision"}}' "$image")
    out=$(run_version "$arch" "$root")
    echo "ok: drafs --version as 65532 -> $out"
    [ "$out" = "drafs $version ($revision)" ] || { echo "FAIL: expected 'drafs $version ($revision)'"; return 1; }

    local user title label
    user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$image")
    [ "$user" = "65532:65532" ] || { echo "FAIL: default user is '$user'"; return 1; }
    echo "ok: default user $user"
    title=$(buildah inspect --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.title"}}' "$image")
    label=$(buildah inspect --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}}' "$image")
    [ "$title" = drafs ] && [ "$label" = "$version" ] || { echo "FAIL: OCI labels title '$title', version '$label'"; return 1; }
    echo "ok: OCI labels (version $label)"

    local size
    size=$(du -sb "$root/drafs" | cut -f1)
    echo "ok: image content $size bytes"
    [ "$size" -lt "$max_bytes" ] || { echo "FAIL: larger than $max_bytes bytes"; return 1; }
)

if index=$(buildah manifest inspect "$tag" 2>/dev/null); then
    archs=$(jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture)"' <<<"$index" | sort | tr '\n' ' ')
    [ "$archs" = "linux/amd64 linux/arm64 " ] || { echo "FAIL: the index $tag lists '$archs', not linux/amd64 and linux/arm64"; exit 1; }
    echo "ok: $tag is an index of $archs"
    for arch in amd64 arm64; do
        # The image checked is the one the index points to, not only one of the same name.
        listed=$(jq -r --arg a "$arch" '.manifests[] | select(.platform.architecture == $a) | .digest' <<<"$index")
        named=$(buildah inspect --type image --format '{{.FromImageDigest}}' "$tag-$arch")
        [ "$listed" = "$named" ] || { echo "FAIL: the index's $arch manifest is $listed, $tag-$arch is $named"; exit 1; }
        check_image "$tag-$arch" "$arch"
    done
else
    arch=$(buildah inspect --format '{{.OCIv1.Architecture}}' "$tag")
    check_image "$tag" "$arch"
fi
echo "ok: $tag"
