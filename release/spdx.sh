#!/usr/bin/env bash
# An SPDX 2.3 JSON document for the drafs binaries from lines
# "NAME vVERSION|LICENSE", one per crate, on standard input (release.sh makes
# them from the lists cargo auditable embeds in the binaries):
#   release/spdx.sh VERSION COMMIT <crates >drafs-VERSION.spdx.json
# Each crate is a package with its crates.io purl; drafs itself is the
# described package, and each crate is its dependency.
set -euo pipefail
version=$1 commit=$2
jq -R -s --arg version "$version" --arg commit "$commit" --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" '
  def id: "SPDXRef-crate-" + (gsub("[^A-Za-z0-9.-]"; "-"));
  [split("\n")[] | select(length > 0) | split("|") | {spec: (.[0] | split(" ")), license: (.[1] // "")}
   | {name: .spec[0], version: (.spec[1] | ltrimstr("v")), license: .license}
   | select(.name != "drafs")] | unique_by(.name + "@" + .version) as $crates
  | {
      spdxVersion: "SPDX-2.3",
      dataLicense: "CC0-1.0",
      SPDXID: "SPDXRef-DOCUMENT",
      name: ("drafs-" + $version),
      documentNamespace: ("https://github.com/drafs/drafs/spdx/" + $version + "-" + $commit),
      creationInfo: {created: $now, creators: ["Tool: drafs release/spdx.sh (cargo auditable)"]},
      packages: ([{
          name: "drafs", SPDXID: "SPDXRef-drafs", versionInfo: $version,
          downloadLocation: "https://github.com/drafs/drafs", filesAnalyzed: false,
          licenseConcluded: "Apache-2.0", licenseDeclared: "Apache-2.0", copyrightText: "NOASSERTION",
          externalRefs: [{referenceCategory: "PACKAGE-MANAGER", referenceType: "purl",
                          referenceLocator: ("pkg:cargo/drafs@" + $version)}]
        }] + [$crates[] | {
          name: .name, SPDXID: ((.name + "-" + .version) | id), versionInfo: .version,
          downloadLocation: ("https://crates.io/api/v1/crates/" + .name + "/" + .version + "/download"),
          filesAnalyzed: false,
          licenseConcluded: "NOASSERTION",
          licenseDeclared: (if .license == "" then "NOASSERTION" else (.license | gsub("/"; " OR ")) end),
          copyrightText: "NOASSERTION",
          externalRefs: [{referenceCategory: "PACKAGE-MANAGER", referenceType: "purl",
                          referenceLocator: ("pkg:cargo/" + .name + "@" + .version)}]
        }]),
      relationships: ([{spdxElementId: "SPDXRef-DOCUMENT", relationshipType: "DESCRIBES", relatedSpdxElement: "SPDXRef-drafs"}]
        + [$crates[] | {spdxElementId: "SPDXRef-drafs", relationshipType: "DEPENDS_ON",
                        relatedSpdxElement: ((.name + "-" + .version) | id)}])
    }'
