#!/usr/bin/env bash
# Build the drafs image: a static binary in a FROM scratch image, for
# linux/amd64 and linux/arm64 under one image index (a manifest list), so that
# `image: registry.example/drafs:TAG` pulls the right one on every node.
#   image/build.sh [TAG]        default tag: drafs:<version from Cargo.toml>
#   DRAFS_PLATFORMS=linux/amd64 image/build.sh TAG   one platform: TAG is a plain image
# With two platforms, TAG is the index and TAG-amd64, TAG-arm64 its images
# (push all of them with `buildah manifest push --all TAG docker://...`).
# Each binary records the crates it is built from (cargo auditable, crates.io
# cargo-auditable at the version below, installed when missing): Trivy, Grype,
# Syft and `cargo audit bin` read the list in the image; release/release.sh
# makes the SBOM from it (docs/deploy.md#releases).
# Static linking: musl (rustup's target; musl-gcc for amd64, Debian's
# gcc-aarch64-linux-gnu as arm64's linker), installed when missing and root;
# amd64 falls back to glibc with crt-static. Builds with buildah, or docker
# (one platform only) when a daemon answers and buildah is absent.
# Prints one line per platform image, "IMAGE BINARY", the amd64 one last.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-drafs:$version}
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
platforms=${DRAFS_PLATFORMS:-linux/arm64,linux/amd64}
target_dir=${CARGO_TARGET_DIR:-target}
# The revision `drafs --version` prints (build.rs reads it).
export DRAFS_REVISION=$revision

apt_install() { # command package
    command -v "$1" >/dev/null 2>&1 && return 0
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq "$2" >/dev/null; }
}
auditable_version=0.7.7
has_auditable() {
    cargo install --list | grep -qx "cargo-auditable v$auditable_version:" && return 0
    echo "build.sh: installing cargo-auditable $auditable_version (crates.io)" >&2
    cargo install cargo-auditable --locked --version "$auditable_version" >&2
}
has_target() {
    rustup target list --installed 2>/dev/null | grep -qx "$1" || rustup target add "$1" >/dev/null 2>&1
}

# Build the binary for one architecture; prints its path.
build_binary() { # arch
    local target
    has_auditable || { echo "build.sh: cannot install cargo-auditable $auditable_version (cargo install cargo-auditable --locked --version $auditable_version)" >&2; exit 1; }
    case $1 in
    amd64)
        target=x86_64-unknown-linux-musl
        if has_target "$target" && apt_install musl-gcc musl-tools; then
            CC_x86_64_unknown_linux_musl=musl-gcc cargo auditable build --profile image --locked --target "$target" >&2
        else
            target=x86_64-unknown-linux-gnu
            echo "musl target unavailable: linking glibc statically (crt-static)" >&2
            RUSTFLAGS="-C target-feature=+crt-static" cargo auditable build --profile image --locked --target "$target" >&2
        fi
        ;;
    arm64)
        target=aarch64-unknown-linux-musl
        has_target "$target" || { echo "build.sh: cannot add the Rust target $target (rustup target add $target)" >&2; exit 1; }
        apt_install aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu ||
            { echo "build.sh: arm64 needs a cross C compiler and linker: apt-get install gcc-aarch64-linux-gnu" >&2; exit 1; }
        # Its linker and C compiler: .cargo/config.toml.
        cargo auditable build --profile image --locked --target "$target" >&2
        ;;
    *) echo "build.sh: unknown platform linux/$1 (linux/amd64, linux/arm64)" >&2; exit 2 ;;
    esac
    echo "$target_dir/$target/image/drafs"
}

# Build one platform's image from its binary.
build_image() { # arch binary image
    # Not $target_dir/image: with --target, that is where cargo keeps the image
    # profile's build scripts and proc macros, and emptying it made every build
    # start over (3 minutes on 2 cores, in every real-node test).
    local context=$target_dir/image-context/$1
    rm -rf "$context" "$context.id" && mkdir -p "$context"
    cp "$2" "$context/drafs"
    local args=(-f image/Containerfile --build-arg VERSION="$version" --build-arg REVISION="$revision"
        --platform "linux/$1" -t "$3" "$context")
    if command -v buildah >/dev/null 2>&1; then
        buildah build --quiet --iidfile "$target_dir/image-context/$1.id" "${args[@]}" >&2
    elif [ "$count" = 1 ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        docker build "${args[@]}" >&2
    else
        echo "build.sh: buildah is needed (docker builds one platform: DRAFS_PLATFORMS=linux/amd64)" >&2
        exit 1
    fi
}

IFS=, read -r -a wanted <<<"$platforms"
count=${#wanted[@]}
# A name may hold an index or an image from an earlier build, never both.
if command -v buildah >/dev/null 2>&1; then
    buildah manifest rm "$tag" >/dev/null 2>&1 || buildah rmi "$tag" >/dev/null 2>&1 || true
fi
lines=()
for platform in "${wanted[@]}"; do
    arch=${platform#linux/}
    bin=$(build_binary "$arch")
    image=$tag
    [ "$count" = 1 ] || image=$tag-$arch
    build_image "$arch" "$bin" "$image"
    line="$image $bin"
    # amd64 last: callers read the last line for the image this machine runs.
    if [ "$arch" = amd64 ]; then lines+=("$line"); else lines=("$line" "${lines[@]}"); fi
done
if [ "$count" -gt 1 ]; then
    buildah manifest create "$tag" >/dev/null
    for platform in "${wanted[@]}"; do
        id=$(cat "$target_dir/image-context/${platform#linux/}.id")
        buildah manifest add "$tag" "containers-storage:${id#sha256:}" >/dev/null
    done
    echo "build.sh: $tag is an index of ${wanted[*]}" >&2
fi
printf '%s\n' "${lines[@]}"
