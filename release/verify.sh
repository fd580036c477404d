#!/usr/bin/env bash
# Check a release directory as a user would before installing from it, and
# fail on any artifact whose content is not what the release produced:
#
#   release/verify.sh DIR --key cosign.pub                  a key-based signature
#   release/verify.sh DIR --certificate-identity ID --certificate-oidc-issuer URL
#                                                            keyless (the release workflow's)
#   release/verify.sh DIR                                    content only: says loudly that
#                                                            no signature was checked
# and, with either anchor:
#   --registry REG     where the release is published (default ghcr.io/drafs):
#                      the chart must name REG/drafs as its image
#   --remote           also check what REG serves: the image index of the
#                      archive, signed, with its SBOM and provenance attested;
#                      the chart, signed, byte for byte the chart of DIR
#   --plain-http       the registry speaks HTTP (a local test registry)
#
# What it checks:
#   - SHA256SUMS is signed by the anchor given on the command line (the
#     signature, a Sigstore bundle, is DIR/SHA256SUMS.sigstore.json: it travels
#     with the files, the anchor does not), and every file matches it;
#   - the OCI archive, blob by blob: its index, the image index (linux/amd64
#     and linux/arm64), each manifest, config and layer present, of the size
#     and digest its descriptor says, each layer's uncompressed digest the
#     config's diff_id, each image's /drafs a static binary of its platform;
#   - the chart: version and appVersion, and the image it deploys when
#     installed with its defaults (values.yaml and every image the templates
#     render) is REG/drafs:VERSION;
#   - the SBOM: SPDX 2.3, naming exactly the crates each binary records it
#     was built from (cargo auditable's list, which scanners read);
#   - the release notes.
#
# Tools: jq, sha256sum, tar, gzip, readelf, python3 (zlib), helm (HELM, else
# on PATH, else the tests' build), and with an anchor cosign v3 (COSIGN, else
# on PATH; tests/go/build.sh release builds one). .ci/run runs it, with a key
# made for the test, on the release tests/release.sh builds, publishes to a
# registry on loopback and signs.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

dir='' key='' identity='' issuer='' registry=ghcr.io/drafs remote=0 plain_http=0
while [ $# -gt 0 ]; do
    case $1 in
    --key) key=${2:?--key needs a file}; shift 2 ;;
    --certificate-identity) identity=${2:?--certificate-identity needs a value}; shift 2 ;;
    --certificate-oidc-issuer) issuer=${2:?--certificate-oidc-issuer needs a value}; shift 2 ;;
    --registry) registry=${2:?--registry needs a value}; shift 2 ;;
    --remote) remote=1; shift ;;
    --plain-http) plain_http=1; shift ;;
    -h | --help) usage ;;
    -*) echo "verify.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$dir" ] || { echo "verify.sh: one directory only" >&2; usage; }; dir=$1; shift ;;
    esac
done
[ -n "$dir" ] || usage
[ -d "$dir" ] || fail "$dir is not a directory"
dir=$(realpath "$dir")
if [ -n "$key" ] && [ -n "$identity$issuer" ]; then fail "give --key or a keyless identity, not both"; fi
if { [ -n "$identity" ] && [ -z "$issuer" ]; } || { [ -z "$identity" ] && [ -n "$issuer" ]; }; then
    fail "a keyless identity needs both --certificate-identity and --certificate-oidc-issuer"
fi
[ -z "$key" ] || [ -f "$key" ] || fail "no key file $key"
[ -z "$key" ] || key=$(realpath "$key")
anchored=0
[ -z "$key$identity" ] || anchored=1
[ "$remote" = 0 ] || [ "$anchored" = 1 ] || fail "--remote checks signatures: give --key or a keyless identity"
registry=${registry%/}
repo=$registry/drafs

cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || fail "no version in Cargo.toml"
files=("drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cosign() {
    local bin=${COSIGN:-}
    [ -n "$bin" ] || bin=$(command -v cosign) ||
        fail "cosign is needed to check signatures (COSIGN=path, or tests/go/build.sh release builds one)"
    "$bin" "$@"
}
# What cosign said went wrong (its warnings left out).
why() { grep -v '^WARNING' "$1" | grep . | tail -n 1; }
# The anchor, as cosign's verify commands take it. A key is its own anchor:
# a signature made with it in private has no transparency-log entry to show.
# A keyless signature's certificate is only trusted with its log entry.
anchor() {
    if [ -n "$key" ]; then
        printf '%s\n' --key "$key" --insecure-ignore-tlog=true
    else
        printf '%s\n' --certificate-identity "$identity" --certificate-oidc-issuer "$issuer"
    fi
}
mapfile -t anchor_args < <(anchor)

# 1. The signature of SHA256SUMS, then every file against it.
sums=$dir/SHA256SUMS
[ -f "$sums" ] || fail "no SHA256SUMS in $dir"
if [ "$anchored" = 1 ]; then
    [ -f "$sums.sigstore.json" ] || fail "no signature of SHA256SUMS ($sums.sigstore.json)"
    cosign verify-blob "${anchor_args[@]}" --bundle "$sums.sigstore.json" "$sums" >"$work/cosign.log" 2>&1 ||
        fail "the signature of SHA256SUMS does not verify against ${key:-$identity}: $(why "$work/cosign.log")"
    echo "ok: SHA256SUMS signed by ${key:+the key }${key:-$identity ($issuer)}"
fi
listed=$(awk '{ print $2 }' "$sums" | sort | tr '\n' ' ')
expected=$(printf '%s\n' "${files[@]}" | sort | tr '\n' ' ')
[ "$listed" = "$expected" ] || fail "SHA256SUMS lists '$listed', not '$expected'"
grep -Eqv '^[0-9a-f]{64}  [A-Za-z0-9._-]+$' "$sums" && fail "SHA256SUMS has a line not of the form 'SHA256  NAME'"
(cd "$dir" && sha256sum --quiet --strict -c SHA256SUMS) || fail "checksums"
echo "ok: checksums of ${#files[@]} files"

# 2. The OCI archive, blob by blob.
oci=$work/oci
mkdir "$oci"
tar -xf "$dir/drafs-$version.oci.tar" -C "$oci" --no-same-owner --no-same-permissions ||
    fail "the OCI archive does not unpack"
jq -e '.imageLayoutVersion == "1.0.0"' "$oci/oci-layout" >/dev/null 2>&1 || fail "the archive has no OCI layout 1.0.0"
# Every file under blobs/ is named by its content, and nothing else is there.
# (No `| grep -q`: under pipefail, the writer killed by SIGPIPE when grep
# stops reading would make a match look like none.)
[ -z "$(find "$oci/blobs" -mindepth 1 ! -path "$oci/blobs/sha256" ! -type f -print -quit)" ] ||
    fail "the archive's blobs/ holds something that is not a file"
blobs=0
shopt -s nullglob
for f in "$oci"/blobs/*/*; do
    name=${f#"$oci/blobs/"}
    [[ $name =~ ^sha256/[0-9a-f]{64}$ ]] || fail "the archive holds a blob not named sha256/HEX: $name"
    [ "$(sha256sum <"$f" | cut -d' ' -f1)" = "${name#sha256/}" ] || fail "the blob $name does not match its digest"
    blobs=$((blobs + 1))
done
shopt -u nullglob

# A descriptor's blob: present, of its size and digest; prints its path.
blob() { # descriptor-json what
    local digest size path
    digest=$(jq -r '.digest // ""' <<<"$1")
    size=$(jq -r '.size // ""' <<<"$1")
    [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || fail "$2: digest '$digest' is not sha256"
    [[ $size =~ ^[0-9]+$ ]] || fail "$2: no size"
    path=$oci/blobs/${digest/://}
    [ -f "$path" ] || fail "$2: the archive lacks the blob $digest"
    [ "$(stat -c %s "$path")" = "$size" ] || fail "$2: $digest is $(stat -c %s "$path") bytes, its descriptor says $size"
    [ "$(sha256sum <"$path" | cut -d' ' -f1)" = "${digest#sha256:}" ] || fail "$2: the blob $digest does not match its digest"
    echo "$path"
}
tagged=$(jq -c --arg v "$version" '[.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $v)]' "$oci/index.json") ||
    fail "the archive's index.json is not JSON"
[ "$(jq length <<<"$tagged")" = 1 ] || fail "the OCI archive has $(jq length <<<"$tagged") manifests tagged $version, not one"
top=$(jq -c '.[0]' <<<"$tagged")
index_digest=$(jq -r .digest <<<"$top")
[ "$(jq -r .mediaType <<<"$top")" = application/vnd.oci.image.index.v1+json ] || fail "$version is not an image index"
index=$(blob "$top" "the image index")
[ "$(jq -r .mediaType "$index")" = application/vnd.oci.image.index.v1+json ] || fail "the image index's own mediaType"
platforms=$(jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture)"' "$index" | sort | tr '\n' ' ')
[ "$platforms" = "linux/amd64 linux/arm64 " ] || fail "the image index lists '$platforms'"
layers=0
for arch in amd64 arm64; do
    desc=$(jq -c --arg a "$arch" '.manifests[] | select(.platform.architecture == $a)' "$index")
    manifest=$(blob "$desc" "the linux/$arch manifest")
    [ "$(jq -r .mediaType "$manifest")" = application/vnd.oci.image.manifest.v1+json ] || fail "the linux/$arch manifest's mediaType"
    config=$(blob "$(jq -c .config "$manifest")" "the linux/$arch config")
    [ "$(jq -r '"\(.os)/\(.architecture)"' "$config")" = "linux/$arch" ] || fail "the linux/$arch config says $(jq -r '"\(.os)/\(.architecture)"' "$config")"
    count=$(jq '.layers | length' "$manifest")
    [ "$count" -ge 1 ] || fail "the linux/$arch manifest has no layer"
    [ "$(jq '.rootfs.diff_ids | length' "$config")" = "$count" ] || fail "the linux/$arch config's diff_ids and layers differ in number"
    root=$work/root-$arch
    mkdir "$root"
    for i in $(seq 0 $((count - 1))); do
        ldesc=$(jq -c ".layers[$i]" "$manifest")
        layer=$(blob "$ldesc" "layer $i of linux/$arch")
        case $(jq -r .mediaType <<<"$ldesc") in
        application/vnd.oci.image.layer.v1.tar) cat "$layer" >"$work/layer.tar" ;;
        application/vnd.oci.image.layer.v1.tar+gzip) gzip -dc "$layer" >"$work/layer.tar" || fail "layer $i of linux/$arch is not gzip" ;;
        *) fail "layer $i of linux/$arch is $(jq -r .mediaType <<<"$ldesc"), which this check does not read" ;;
        esac
        [ "sha256:$(sha256sum <"$work/layer.tar" | cut -d' ' -f1)" = "$(jq -r ".rootfs.diff_ids[$i]" "$config")" ] ||
            fail "layer $i of linux/$arch does not match the config's diff_id"
        tar -xf "$work/layer.tar" -C "$root" --no-same-owner --no-same-permissions || fail "layer $i of linux/$arch does not unpack"
        layers=$((layers + 1))
    done
    [ -f "$root/drafs" ] || fail "the linux/$arch image has no /drafs"
    case $arch in amd64) machine="Advanced Micro Devices X86-64" ;; arm64) machine=AArch64 ;; esac
    [ "$(readelf -h "$root/drafs" | sed -n 's/^ *Machine: *//p')" = "$machine" ] || fail "the linux/$arch /drafs is not an $machine binary"
    readelf -l "$root/drafs" | grep INTERP >/dev/null && fail "the linux/$arch /drafs is dynamically linked"
    cp "$root/drafs" "$work/drafs-$arch"
done
echo "ok: image index $index_digest of $platforms($blobs blobs, each of its digest; $layers layers, each of its diff_id)"

# 3. The chart, and the image it deploys.
chart=$dir/drafs-$version.tgz
tar -tzf "$chart" >"$work/chart.list" || fail "the chart does not unpack"
grep -qv '^drafs/' "$work/chart.list" && fail "the chart holds files outside drafs/"
mkdir "$work/chart" && tar -xzf "$chart" -C "$work/chart" --no-same-owner --no-same-permissions
meta=$work/chart/drafs/Chart.yaml
grep -q "^version: $version\$" "$meta" || fail "the chart's version is not $version"
grep -q "^appVersion: \"\\?$version\"\\?\$" "$meta" || fail "the chart's appVersion is not $version"
# values.yaml's image block: repository, and a tag empty (the appVersion) or the version.
image_values=$(awk '/^image:/ { inside = 1; next } /^[^ #]/ { inside = 0 } inside && /^  [a-z]+:/' "$work/chart/drafs/values.yaml")
value() { sed -n "s/^  $1: *\"\\{0,1\\}\\([^\"#]*\\)\"\\{0,1\\} *\\(#.*\\)\\{0,1\\}\$/\\1/p" <<<"$image_values" | sed 's/ *$//'; }
[ "$(value repository)" = "$repo" ] || fail "the chart's image.repository is '$(value repository)', not $repo"
tag=$(value tag)
[ -z "$tag" ] || [ "$tag" = "$version" ] || fail "the chart's image.tag is '$tag', not $version"
helm=${HELM:-}
[ -n "$helm" ] || helm=$(command -v helm) || helm=$(tests/go/build.sh | tail -n 1)/helm
# Every image the chart renders, the webhook's and the agent's, and the one
# the webhook injects (DRAFS_IMAGE).
for set in "" "--set node.enabled=true"; do
    # shellcheck disable=SC2086 # $set is empty or two words
    "$helm" template drafs "$chart" --namespace drafs-system $set >"$work/rendered.yaml" 2>"$work/helm.log" ||
        fail "the chart does not render${set:+ with $set}: $(tail -n 3 "$work/helm.log")"
    awk '/^ *(- )?image: / { sub(/^ *(- )?image: */, ""); print }
         /name: DRAFS_IMAGE$/ { getline; sub(/^ *value: */, ""); print }' "$work/rendered.yaml" | tr -d '"' >>"$work/images"
done
sort -u "$work/images" >"$work/images.sorted"
[ "$(wc -l <"$work/images")" -ge 3 ] || fail "the chart renders $(wc -l <"$work/images") image references, expected the webhook's, the injected one and the agent's"
[ "$(cat "$work/images.sorted")" = "$repo:$version" ] || fail "the chart deploys $(tr '\n' ' ' <"$work/images.sorted"), not $repo:$version"
echo "ok: chart $version, deploying $repo:$version ($(wc -l <"$work/images") image references rendered)"

# 4. The SBOM: the crates the binaries record (cargo auditable), exactly.
sbom=$dir/drafs-$version.spdx.json
[ "$(jq -r .spdxVersion "$sbom")" = SPDX-2.3 ] || fail "the SBOM is not SPDX 2.3"
for arch in amd64 arm64; do
    release/auditable.sh "$work/drafs-$arch" >"$work/crates-$arch" || fail "the linux/$arch binary carries no dependency list"
done
sort -u "$work/crates-amd64" "$work/crates-arm64" >"$work/crates"
jq -r '.packages[] | select(.name != "drafs") | "\(.name) \(.versionInfo)"' "$sbom" | sort -u >"$work/sbom-crates"
if ! cmp -s "$work/crates" "$work/sbom-crates"; then
    diff "$work/crates" "$work/sbom-crates" | head -n 10 >&2 || true
    fail "the SBOM's crates are not those the binaries were built from (< binaries, > SBOM)"
fi
for crate in drafs kube tokio rustls; do
    jq -e --arg c "$crate" 'any(.packages[]; .name == $c)' "$sbom" >/dev/null || fail "the SBOM does not name $crate"
done
echo "ok: SBOM of $(jq '.packages | length' "$sbom") packages, the crates both binaries record"

# 5. The release notes.
[ "$(head -n 1 "$dir/RELEASE-NOTES.md")" = "# drafs $version" ] || fail "the release notes' title"
[ "$(wc -l <"$dir/RELEASE-NOTES.md")" -gt 3 ] || fail "the release notes are empty"
echo "ok: release notes"

# 6. What the registry serves: the same image index and chart, signed.
if [ "$remote" = 1 ]; then
    http=()
    helm_http=()
    if [ "$plain_http" = 1 ]; then http=(--allow-http-registry=true --allow-insecure-registry=true); helm_http=(--plain-http); fi
    cosign verify "${anchor_args[@]}" "${http[@]}" "$repo:$version" >"$work/verified.json" 2>"$work/cosign.log" ||
        fail "the image $repo:$version is not signed by ${key:-$identity}: $(why "$work/cosign.log")"
    signed=$(jq -r '.[].critical.image["docker-manifest-digest"]' "$work/verified.json" | sort -u)
    [ "$signed" = "$index_digest" ] || fail "$repo:$version is $signed, the archive's image index is $index_digest"
    echo "ok: $repo:$version is the archive's image index, signed"
    for type in spdxjson slsaprovenance1; do
        cosign verify-attestation "${anchor_args[@]}" "${http[@]}" --type "$type" "$repo@$index_digest" >"$work/attestation.json" 2>"$work/cosign.log" ||
            fail "no $type attestation of $repo@$index_digest signed by ${key:-$identity}: $(why "$work/cosign.log")"
        if [ "$type" = spdxjson ]; then
            # One attestation a line; one of them must be DIR's SBOM, as it is.
            jq -S . "$sbom" >"$work/sbom.sorted"
            found=0
            while IFS= read -r payload; do
                base64 -d <<<"$payload" | jq -S .predicate >"$work/attested-sbom.json" || continue
                if cmp -s "$work/sbom.sorted" "$work/attested-sbom.json"; then found=1; fi
            done < <(jq -r '.payload' "$work/attestation.json")
            [ "$found" = 1 ] || fail "no SBOM attested to the image is DIR's"
        fi
    done
    echo "ok: the image's SBOM (DIR's) and provenance attested"
    mkdir "$work/pulled"
    "$helm" pull "oci://$registry/charts/drafs" --version "$version" "${helm_http[@]}" -d "$work/pulled" >"$work/pull.log" 2>&1 ||
        fail "helm pull oci://$registry/charts/drafs --version $version: $(tail -n 3 "$work/pull.log")"
    cmp -s "$work/pulled/drafs-$version.tgz" "$chart" || fail "the chart $registry/charts/drafs:$version is not DIR's"
    chart_digest=$(sed -n 's/^Digest: *//p' "$work/pull.log")
    [[ $chart_digest =~ ^sha256:[0-9a-f]{64}$ ]] || fail "helm pull printed no digest"
    cosign verify "${anchor_args[@]}" "${http[@]}" "$registry/charts/drafs@$chart_digest" >/dev/null 2>"$work/cosign.log" ||
        fail "the chart $registry/charts/drafs@$chart_digest is not signed by ${key:-$identity}: $(why "$work/cosign.log")"
    echo "ok: the chart $registry/charts/drafs:$version is DIR's, signed"
fi

if [ "$anchored" = 1 ]; then
    echo "ok: drafs $version verified${key:+ against the key $key}${identity:+ against $identity}"
else
    cat >&2 <<EOF
################################################################################
# WARNING: NO SIGNATURE WAS CHECKED. The files agree with each other and with
# SHA256SUMS, but SHA256SUMS travels with them: anyone who changed them could
# have rewritten it. Give the signer: --key FILE, or --certificate-identity
# and --certificate-oidc-issuer (docs/deploy.md#releases).
################################################################################
EOF
    echo "ok: drafs $version consistent, SIGNATURE NOT CHECKED"
fi
