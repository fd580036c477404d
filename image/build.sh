#!/usr/bin/env bash
# Build the drafs image: a static binary in a FROM scratch image.
#   image/build.sh [TAG]        default tag: drafs:<version from Cargo.toml>
# Static linking: musl when the target can be installed (rustup + musl-gcc),
# otherwise glibc with crt-static. Builds with docker when a daemon answers,
# else with buildah. Prints the tag and the binary it put in the image.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-drafs:$version}
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

musl=x86_64-unknown-linux-musl
if rustup target list --installed 2>/dev/null | grep -qx "$musl" || rustup target add "$musl" >/dev/null 2>&1; then
    if ! command -v musl-gcc >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -qq musl-tools >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq musl-tools >/dev/null; } || true
    fi
fi
if rustup target list --installed 2>/dev/null | grep -qx "$musl" && command -v musl-gcc >/dev/null 2>&1; then
    target=$musl
    CC_x86_64_unknown_linux_musl=musl-gcc cargo build --profile image --locked --target "$target" >&2
else
    target=x86_64-unknown-linux-gnu
    echo "musl target unavailable: linking glibc statically (crt-static)" >&2
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile image --locked --target "$target" >&2
fi
target_dir=${CARGO_TARGET_DIR:-target}
bin=$target_dir/$target/image/drafs

# Not $target_dir/image: with --target, that is where cargo keeps the image
# profile's build scripts and proc macros, and emptying it made every build
# start over (3 minutes on 2 cores, in every real-node test).
context=$target_dir/image-context
rm -rf "$context" && mkdir -p "$context"
cp "$bin" "$context/drafs"

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    docker build -f image/Containerfile --build-arg VERSION="$version" --build-arg REVISION="$revision" -t "$tag" "$context" >&2
elif command -v buildah >/dev/null 2>&1; then
    buildah build --quiet -f image/Containerfile --build-arg VERSION="$version" --build-arg REVISION="$revision" -t "$tag" "$context" >&2
else
    echo "neither a docker daemon nor buildah is available" >&2
    exit 1
fi
echo "$tag $bin"
