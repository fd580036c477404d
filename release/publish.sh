#!/usr/bin/env bash
# Publish and sign a release that release/release.sh built into DIR, as the
# release workflow does (.github/workflows/release.yml) and tests/release.sh
# does against a registry on loopback:
#
#   release/publish.sh DIR REGISTRY              keyless: cosign's OIDC identity
#                                                (the workflow's, GitHub's OIDC token)
#   release/publish.sh --key cosign.key DIR REGISTRY   a key (COSIGN_PASSWORD); no
#                                                transparency log (a private or test key)
#   --plain-http                                 the registry speaks HTTP (loopback tests)
#
#   1. the image index drafs:VERSION (buildah's local storage, as release.sh
#      left it) to REGISTRY/drafs:VERSION, every platform's image with it
#      (buildah manifest push --all); the digest the registry got must be the
#      archive's, or nothing is signed;
#   2. the chart to oci://REGISTRY/charts (helm push);
#   3. signatures: the image index and the chart (cosign sign, by digest),
#      the SBOM and a SLSA v1 build provenance attested to the image index
#      (cosign attest), and SHA256SUMS (cosign sign-blob; its Sigstore bundle
#      written as DIR/SHA256SUMS.sigstore.json, the one file added to DIR).
# Registry credentials are the caller's (buildah login, helm registry login;
# cosign reads both).
#
# Tools: buildah, jq, helm (HELM, else the tests' build), cosign v3 (COSIGN,
# else tests/go/build.sh release).
set -euo pipefail
fail() { echo "publish.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
key='' plain_http=0 args=()
while [ $# -gt 0 ]; do
    case $1 in
    --key) key=${2:?--key needs a file}; shift 2 ;;
    --plain-http) plain_http=1; shift ;;
    -h | --help) usage ;;
    -*) echo "publish.sh: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
    esac
done
[ ${#args[@]} = 2 ] || usage
dir=$(realpath "${args[0]}")
registry=${args[1]%/}
[[ $registry =~ ^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$ ]] || fail "'$registry' is not a registry path (HOST[:PORT][/PATH])"
[ -z "$key" ] || key=$(realpath "$key")
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
for f in SHA256SUMS "drafs-$version.oci.tar" "drafs-$version.tgz" "drafs-$version.spdx.json"; do
    [ -f "$dir/$f" ] || fail "$dir has no $f (release/release.sh builds it)"
done
[ ! -e "$dir/SHA256SUMS.sigstore.json" ] || fail "$dir is already signed (SHA256SUMS.sigstore.json)"
(cd "$dir" && sha256sum --quiet --strict -c SHA256SUMS) || fail "$dir does not match its SHA256SUMS"
helm=${HELM:-$(tests/go/build.sh | tail -n 1)/helm}
cosign=${COSIGN:-$(tests/go/build.sh release | tail -n 1)/cosign}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The archive's image index: what is pushed must be it, byte for byte.
tar -xf "$dir/drafs-$version.oci.tar" -C "$work" index.json
index_digest=$(jq -r --arg v "$version" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $v) | .digest' "$work/index.json")
[[ $index_digest =~ ^sha256:[0-9a-f]{64}$ ]] || fail "the archive has no image index tagged $version"

tls=() helm_http=() cosign_http=()
if [ "$plain_http" = 1 ]; then
    tls=(--tls-verify=false) helm_http=(--plain-http) cosign_http=(--allow-http-registry=true --allow-insecure-registry=true)
fi
buildah manifest push --quiet --all "${tls[@]}" --digestfile "$work/pushed" "drafs:$version" "docker://$registry/drafs:$version" >/dev/null
[ "$(cat "$work/pushed")" = "$index_digest" ] ||
    fail "the registry got the image index $(cat "$work/pushed"), the archive holds $index_digest: nothing signed"
echo "publish.sh: $registry/drafs:$version is $index_digest" >&2
"$helm" push "$dir/drafs-$version.tgz" "oci://$registry/charts" "${helm_http[@]}" >"$work/helm.log" 2>&1 ||
    fail "helm push: $(cat "$work/helm.log")"
chart_digest=$(sed -n 's/^Digest: *//p' "$work/helm.log")
[[ $chart_digest =~ ^sha256:[0-9a-f]{64}$ ]] || fail "helm push printed no digest: $(cat "$work/helm.log")"
echo "publish.sh: $registry/charts/drafs:$version is $chart_digest" >&2

# The build's provenance (SLSA v1): what was built, from which commit, by
# what. In the workflow, the GitHub run; elsewhere, this machine's git.
commit=$(git rev-parse --verify 'HEAD^{commit}')
jq -n --arg version "$version" --arg commit "$commit" \
    --arg repo "${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:-drafs/drafs}" \
    --arg ref "${GITHUB_REF:-refs/tags/v$version}" \
    --arg builder "${GITHUB_SERVER_URL:+$GITHUB_SERVER_URL/${GITHUB_WORKFLOW_REF:-}}" \
    --arg run "${GITHUB_RUN_ID:+$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID/attempts/${GITHUB_RUN_ATTEMPT:-1}}" \
    --arg sums "$(sha256sum "$dir/SHA256SUMS" | cut -d' ' -f1)" '{
    buildDefinition: {
        buildType: "https://github.com/drafs/drafs/release/release.sh@v1",
        externalParameters: {repository: $repo, ref: $ref, version: $version},
        resolvedDependencies: [{uri: ("git+" + $repo + "@" + $ref), digest: {gitCommit: $commit}}]
    },
    runDetails: {
        builder: {id: (if $builder == "" then "local: release/release.sh" else $builder end)},
        metadata: ({invocationId: $run} | with_entries(select(.value != ""))),
        byproducts: [{name: "SHA256SUMS", digest: {sha256: $sums}}]
    }
}' >"$work/provenance.json"

# Signing: keyless (the OIDC identity cosign finds: in GitHub Actions, the
# workflow's) or with the key, then without the transparency log.
sign_args=(--yes)
if [ -n "$key" ]; then
    sign_args+=(--key "$key" --tlog-upload=false --use-signing-config=false)
fi
"$cosign" sign "${sign_args[@]}" "${cosign_http[@]}" "$registry/drafs@$index_digest" ||
    fail "cosign sign $registry/drafs@$index_digest"
"$cosign" attest "${sign_args[@]}" "${cosign_http[@]}" --type spdxjson --predicate "$dir/drafs-$version.spdx.json" \
    "$registry/drafs@$index_digest" || fail "cosign attest the SBOM"
"$cosign" attest "${sign_args[@]}" "${cosign_http[@]}" --type slsaprovenance1 --predicate "$work/provenance.json" \
    "$registry/drafs@$index_digest" || fail "cosign attest the provenance"
"$cosign" sign "${sign_args[@]}" "${cosign_http[@]}" "$registry/charts/drafs@$chart_digest" ||
    fail "cosign sign $registry/charts/drafs@$chart_digest"
"$cosign" sign-blob "${sign_args[@]}" --bundle "$work/SHA256SUMS.sigstore.json" "$dir/SHA256SUMS" >/dev/null ||
    fail "cosign sign-blob SHA256SUMS"
mv -n "$work/SHA256SUMS.sigstore.json" "$dir/"
echo "publish.sh: signed $registry/drafs@$index_digest (with its SBOM and provenance), $registry/charts/drafs@$chart_digest and SHA256SUMS" >&2
