#!/usr/bin/env bash
# The release as a user gets it, end to end, against an OCI registry this test
# starts on loopback (.ci/run runs it; docs/deploy.md#releases):
#
#   tests/release.sh           builds the release (release/release.sh), then all below
#   tests/release.sh DIR       takes a release built before for a registry on
#                              127.0.0.1:PORT (its chart names it), and buildah's
#                              drafs:VERSION as release.sh left it
#
#  1. release.sh refuses, before building anything: a non-empty OUTDIR (its
#     files kept), a relative OUTDIR that names a directory of the repository
#     (resolved against the caller's directory), a dirty clone git does not
#     trust (as root), a commit git cannot give;
#  2. a registry (CNCF Distribution, tests/go/build.sh release) on 127.0.0.1,
#     on a port it chooses; the release built for it;
#  3. a key pair made for the test; release/publish.sh pushes the image index
#     (buildah manifest push --all) and the chart (helm push) and signs them,
#     the SBOM and provenance attested, SHA256SUMS signed;
#  4. cosign verify against the key (image, chart, attestations), helm pull
#     and helm template from oci://, release/verify.sh --key --remote;
#  5. each tampering refused, with the reason: a layer replaced, the config
#     and layer blobs removed, SHA256SUMS regenerated in place, the chart's
#     image changed, a crate taken out of the SBOM, a signature by another
#     key, the registry's tag or chart replaced. Without a signature to check, verify.sh still refuses what the
#     files themselves betray and says loudly what it did not check.
# Prints "N passed, N failed"; exits 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
given=${1:-}

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok: $*"; }
failure() { failed=$((failed + 1)); echo "FAIL: $*"; }
die() { echo "release test: $*" >&2; exit 1; }

work=$(mktemp -d)
registry_pid=''
cleanup() {
    [ -z "$registry_pid" ] || { kill "$registry_pid" 2>/dev/null; wait "$registry_pid" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

helm=${HELM:-$(tests/go/build.sh | tail -n 1)/helm}
tools=$(tests/go/build.sh release | tail -n 1)
cosign=$tools/cosign
export HELM=$helm COSIGN=$cosign
# cosign keeps nothing of the test's in the caller's home, nor reads its
# registry credentials: TUF metadata and docker's config of the test's own.
# (buildah reads DOCKER_CONFIG too, and wants the file there).
export TUF_ROOT=$work/sigstore DOCKER_CONFIG=$work/docker
mkdir "$DOCKER_CONFIG" && echo '{"auths": {}}' >"$DOCKER_CONFIG/config.json"
echo "release test: tools ready after $((SECONDS - start)) s"

# 1. release.sh's refusals (each before any build).
expect_refusal() { # name pattern command...
    local name=$1 pattern=$2 out
    shift 2
    if out=$("$@" 2>&1); then
        failure "$name: release.sh went on"
    elif grep -q -- "$pattern" <<<"$out"; then
        pass "$name: $(grep -- "$pattern" <<<"$out" | head -n 1)"
    else
        failure "$name: refused for another reason: $out"
    fi
}
mkdir -p "$work/caller/docs" "$work/full"
echo keep >"$work/full/file"
expect_refusal "a non-empty OUTDIR" "is not empty" release/release.sh "$work/full"
if [ "$(cat "$work/full/file")" = keep ]; then pass "its files kept"; else failure "the non-empty OUTDIR lost its files"; fi
echo keep >"$work/caller/docs/mine"
docs_before=$(find docs -type f -exec sha256sum {} + | sort)
# shellcheck disable=SC2016 # the arguments are expanded by that bash
expect_refusal "'release.sh docs' from another directory" "$work/caller/docs is not empty" \
    bash -c 'cd "$1/caller" && "$2/release/release.sh" docs' _ "$work" "$repo"
if [ "$(find docs -type f -exec sha256sum {} + | sort)" = "$docs_before" ] && [ -f "$work/caller/docs/mine" ]; then
    pass "the repository's docs/ and the caller's kept"
else
    failure "docs/ changed"
fi
# git answering with an error, never taken for a clean tree or a commit.
mkdir "$work/fakegit"
cat >"$work/fakegit/git" <<EOF
#!/bin/sh
case "\$*" in *"\$FAIL_GIT"*) echo "fatal: \$FAIL_GIT failed (test)" >&2; exit 128 ;; esac
exec $(command -v git) "\$@"
EOF
chmod +x "$work/fakegit/git"
expect_refusal "git status failing" "git cannot tell the checkout's state" \
    env PATH="$work/fakegit:$PATH" FAIL_GIT=status release/release.sh "$work/out1"
expect_refusal "git rev-parse failing" "git cannot tell the commit" \
    env PATH="$work/fakegit:$PATH" FAIL_GIT=rev-parse release/release.sh "$work/out2"
if [ ! -e "$work/out1" ] && [ ! -e "$work/out2" ]; then pass "no OUTDIR made by the refused runs"; else failure "a refused run made its OUTDIR"; fi
if [ "$(id -u)" = 0 ]; then
    # A dirty clone owned by someone else: git refuses to read it ("dubious ownership").
    git clone -q --no-hardlinks "$repo" "$work/clone"
    echo dirt >>"$work/clone/README.md"
    chown -R 65534:65534 "$work/clone"
    expect_refusal "a dirty clone git does not trust" "git cannot tell the checkout's state" \
        env -u GIT_DIR "$work/clone/release/release.sh" "$work/out3"
else
    echo "SKIPPED (not root): a clone owned by another user"
fi

# 2. The registry, on loopback, on the port it chooses (or the one the given
# release names).
port=0
if [ -n "$given" ]; then
    given=$(realpath "$given")
    port=$(tar -xzOf "$given/drafs-$version.tgz" drafs/values.yaml | sed -n 's|^  repository: 127\.0\.0\.1:\([0-9]*\)/drafs$|\1|p')
    [ -n "$port" ] || die "$given's chart does not name a registry on 127.0.0.1"
fi
mkdir "$work/registry"
cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: info, formatter: text, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}, delete: {enabled: true}}
http: {addr: "127.0.0.1:$port"}
EOF
"$tools/registry" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
deadline=$((SECONDS + 60))
until grep -q 'listening on 127.0.0.1:' "$work/registry.log"; do
    kill -0 "$registry_pid" 2>/dev/null || die "the registry exited: $(tail -n 5 "$work/registry.log")"
    [ $SECONDS -lt $deadline ] || die "the registry did not listen within 60 s"
    sleep 0.1
done
port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/registry.log" | head -n 1)
reg=127.0.0.1:$port
curl -sf "http://$reg/v2/" >/dev/null || die "the registry at $reg does not answer /v2/"
pass "registry on $reg"

# The release, for this registry.
if [ -n "$given" ]; then
    cp -a "$given" "$work/release"
    rel=$work/release
else
    rel=$work/release
    DRAFS_REGISTRY=$reg release/release.sh "$rel" >/dev/null
    echo "release test: release built after $((SECONDS - start)) s"
fi

# 3. Published and signed with a key made for the test.
export COSIGN_PASSWORD=test
(cd "$work" && "$cosign" generate-key-pair >/dev/null 2>&1 && mkdir other &&
    cd other && "$cosign" generate-key-pair >/dev/null 2>&1) || die "cosign generate-key-pair"
release/publish.sh --key "$work/cosign.key" --plain-http "$rel" "$reg" 2>"$work/publish.log" ||
    die "publish.sh: $(tail -n 20 "$work/publish.log")"
grep 'publish.sh:' "$work/publish.log"
pass "published and signed after $((SECONDS - start)) s"

# 4. Verified: cosign against the key, helm from the registry, verify.sh.
index_digest=$(sed -n "s|^publish.sh: $reg/drafs:$version is \(sha256:[0-9a-f]*\)\$|\1|p" "$work/publish.log")
chart_digest=$(sed -n "s|^publish.sh: $reg/charts/drafs:$version is \(sha256:[0-9a-f]*\)\$|\1|p" "$work/publish.log")
http=(--allow-http-registry=true --allow-insecure-registry=true)
offline=(--insecure-ignore-tlog=true)
cosign_ok() { # name command...
    local name=$1
    shift
    if "$cosign" "$@" >"$work/cosign.out" 2>&1; then pass "$name"; else failure "$name: $(tail -n 3 "$work/cosign.out")"; fi
}
cosign_refused() { # name command...
    local name=$1
    shift
    if "$cosign" "$@" >"$work/cosign.out" 2>&1; then failure "$name: cosign verified it"; else pass "$name refused: $(grep -i error "$work/cosign.out" | tail -n 1)"; fi
}
cosign_ok "cosign verify --key: the image index $reg/drafs:$version" verify --key "$work/cosign.pub" "${offline[@]}" "${http[@]}" "$reg/drafs:$version"
cosign_ok "cosign verify --key: the chart $reg/charts/drafs@$chart_digest" verify --key "$work/cosign.pub" "${offline[@]}" "${http[@]}" "$reg/charts/drafs@$chart_digest"
cosign_ok "cosign verify-attestation --type spdxjson" verify-attestation --key "$work/cosign.pub" "${offline[@]}" "${http[@]}" --type spdxjson "$reg/drafs@$index_digest"
cosign_ok "cosign verify-attestation --type slsaprovenance1" verify-attestation --key "$work/cosign.pub" "${offline[@]}" "${http[@]}" --type slsaprovenance1 "$reg/drafs@$index_digest"
cosign_ok "cosign verify-blob --key: SHA256SUMS" verify-blob --key "$work/cosign.pub" "${offline[@]}" --bundle "$rel/SHA256SUMS.sigstore.json" "$rel/SHA256SUMS"
cosign_refused "cosign verify against another key: the image" verify --key "$work/other/cosign.pub" "${offline[@]}" "${http[@]}" "$reg/drafs:$version"
cosign_refused "cosign verify against another key: the chart" verify --key "$work/other/cosign.pub" "${offline[@]}" "${http[@]}" "$reg/charts/drafs@$chart_digest"

if "$helm" template drafs "oci://$reg/charts/drafs" --version "$version" --plain-http --namespace drafs-system >"$work/template.yaml" 2>&1 &&
    images=$(sed -n 's/^ *image: *//p' "$work/template.yaml" | sort -u) && [ "$images" = "$reg/drafs:$version" ]; then
    pass "helm template oci://$reg/charts/drafs --version $version: image $images"
else
    failure "helm template oci://: $(grep -m 3 'image:\|Error' "$work/template.yaml")"
fi

verify() { release/verify.sh "$@" --registry "$reg" --plain-http; }
if verify "$rel" --key "$work/cosign.pub" --remote >"$work/verify.out" 2>&1; then
    sed 's/^/    /' "$work/verify.out"
    pass "verify.sh --key --remote"
else
    failure "verify.sh --key --remote: $(cat "$work/verify.out")"
fi
if verify "$rel" >"$work/verify.out" 2>&1 && grep -q 'NO SIGNATURE WAS CHECKED' "$work/verify.out"; then
    pass "verify.sh without an anchor passes an intact release, saying loudly that no signature was checked"
else
    failure "verify.sh without an anchor: $(cat "$work/verify.out")"
fi

# 5. Tampering.
refused() { # name pattern verify.sh-arguments...
    local name=$1 pattern=$2 out
    shift 2
    if out=$(verify "$@" 2>&1); then
        failure "$name: verify.sh passed it: $(tail -n 2 <<<"$out")"
    elif grep -q -- "$pattern" <<<"$out"; then
        pass "$name: refused: $(grep -- "$pattern" <<<"$out" | head -n 1)"
    else
        failure "$name: refused for another reason than '$pattern': $(tail -n 3 <<<"$out")"
    fi
}
tampered() { # name: a fresh copy of the release, with its OCI layout unpacked in $t.oci
    t=$work/t-$1
    cp -a "$rel" "$t"
    mkdir "$t.oci"
    tar -xf "$t/drafs-$version.oci.tar" -C "$t.oci"
}
repack() { # the OCI layout back into the archive, SHA256SUMS regenerated in place
    (cd "$t.oci" && tar -cf "$t/drafs-$version.oci.tar" oci-layout index.json blobs)
    resum
}
resum() { (cd "$t" && sha256sum "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json" RELEASE-NOTES.md >SHA256SUMS); }
manifest_of() { # arch -> the blob path of that platform's manifest
    local index
    index=$(jq -r --arg v "$version" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $v) | .digest' "$t.oci/index.json")
    echo "$t.oci/blobs/$(jq -r --arg a "$1" '.manifests[] | select(.platform.architecture == $a) | .digest' "$t.oci/blobs/${index/://}" | tr : /)"
}

tampered layer
layer=$(jq -r '.layers[0].digest' "$(manifest_of amd64)")
size=$(stat -c %s "$t.oci/blobs/${layer/://}")
head -c "$size" /dev/urandom >"$t.oci/blobs/${layer/://}"
repack
refused "the amd64 layer replaced, SHA256SUMS regenerated" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
refused "the amd64 layer replaced, SHA256SUMS regenerated, no anchor" "does not match its digest" "$t"

tampered blobs
before=$(find "$t.oci/blobs" -type f | wc -l)
for arch in amd64 arm64; do
    m=$(manifest_of $arch)
    for d in $(jq -r '.config.digest, .layers[].digest' "$m"); do rm -f "$t.oci/blobs/${d/://}"; done
done
after=$(find "$t.oci/blobs" -type f | wc -l)
repack
refused "every config and layer blob removed ($before blobs down to $after), SHA256SUMS regenerated" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
refused "every config and layer blob removed, no anchor" "the archive lacks the blob" "$t"

tampered sums
echo "- and one more thing." >>"$t/RELEASE-NOTES.md"
resum
refused "the release notes changed, SHA256SUMS regenerated in place" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
if out=$(verify "$t" 2>&1) && grep -q 'NO SIGNATURE WAS CHECKED' <<<"$out"; then
    pass "the same without an anchor: passes, as nothing in the files betrays it, saying loudly that no signature was checked"
else
    failure "the same without an anchor: $(tail -n 3 <<<"$out")"
fi

tampered chart
mkdir "$t.chart"
tar -xzf "$t/drafs-$version.tgz" -C "$t.chart"
sed -i "s|^  repository: .*|  repository: evil.example/drafs|" "$t.chart/drafs/values.yaml"
rm "$t/drafs-$version.tgz"
"$helm" package "$t.chart/drafs" --destination "$t" >/dev/null
resum
refused "the chart's image set to another registry, SHA256SUMS regenerated" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
refused "the chart's image set to another registry, no anchor" "the chart's image.repository is 'evil.example/drafs'" "$t"

tampered sbom
jq '.packages |= map(select(.name != "rustls"))' "$rel/drafs-$version.spdx.json" >"$t/drafs-$version.spdx.json"
resum
refused "a crate taken out of the SBOM, SHA256SUMS regenerated" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
refused "a crate taken out of the SBOM, no anchor" "the SBOM's crates are not those the binaries were built from" "$t"

tampered otherkey
(cd "$work/other" && "$cosign" sign-blob --yes --key cosign.key --tlog-upload=false --use-signing-config=false \
    --bundle "$t/SHA256SUMS.sigstore.json" "$t/SHA256SUMS" >/dev/null 2>&1) || die "signing with the other key"
refused "SHA256SUMS signed by another key" "signature of SHA256SUMS does not verify" "$t" --key "$work/cosign.pub"
refused "the intact release against another key" "signature of SHA256SUMS does not verify" "$rel" --key "$work/other/cosign.pub"
rm "$t/SHA256SUMS.sigstore.json"
refused "the signature removed" "no signature of SHA256SUMS" "$t" --key "$work/cosign.pub"

# The registry's copies replaced (the directory intact): the tag moved to
# another image, then put back; the chart's tag pushed over with another chart.
tls=(--tls-verify=false)
buildah push --quiet "${tls[@]}" "drafs:$version-amd64" "docker://$reg/drafs:$version" >/dev/null
refused "the registry's tag $version moved to another image" "is not signed by\|the archive's image index is" "$rel" --key "$work/cosign.pub" --remote
buildah manifest push --quiet --all "${tls[@]}" "drafs:$version" "docker://$reg/drafs:$version" >/dev/null
if verify "$rel" --key "$work/cosign.pub" --remote >/dev/null 2>&1; then pass "the tag put back: verified again"; else failure "the tag put back: not verified"; fi
"$helm" push "$work/t-chart/drafs-$version.tgz" "oci://$reg/charts" --plain-http >/dev/null 2>&1
refused "the registry's chart $version pushed over with the tampered one" "is not DIR's" "$rel" --key "$work/cosign.pub" --remote

echo "release test: done after $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
