#!/usr/bin/env bash
# Fuzz drafs's input handling: `fuzz/run.sh [SECONDS]` runs each target
# (resolve_tree, inject, decode, admission) for SECONDS (default 60) with cargo fuzz, seeded
# from the project's examples. Needs cargo-fuzz (`cargo install cargo-fuzz`);
# RUSTC_BOOTSTRAP lets the stable toolchain take cargo fuzz's -Z flags.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
mkdir -p corpus/resolve_tree corpus/inject corpus/decode corpus/admission
cp ../examples/offline/*.yaml corpus/resolve_tree/
cp ../tests/inject/*.yaml corpus/inject/
for f in ../examples/*/*.yaml; do rel=${f#../examples/}; cp "$f" "corpus/inject/${rel//\//_}"; done
python3 - <<'PY'
import json, pathlib
slice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
         "spec": {"driver": "gpu.example.com", "nodeName": "n", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "g1", "attributes": {"uuid": {"string": "U"}}}, {"name": "g2"}]}}
pathlib.Path("corpus/decode/slice.json").write_text(json.dumps(slice))
claim = {"metadata": {"name": "c"}, "spec": {}, "status": {"allocation": {"devices": {"results": [
    {"request": "r", "driver": "d", "pool": "p", "device": "x"}]}}, "devices": [
    {"driver": "d", "pool": "p", "device": "x", "data": {"a": {"b": [1, 2]}}, "networkData": {"interfaceName": "eth0"}}]}}
pathlib.Path("corpus/decode/claim.json").write_text(json.dumps(claim))
review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"drafs.dev/inject": "sidecar-fuse"},
        "annotations": {"drafs.dev/metadata-dir": "/m", "drafs.dev/require": "a/b/0/c", "drafs.dev/timeout": "1m"}},
        "spec": {"serviceAccountName": "default", "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}],
                 "containers": [{"name": "a", "resources": {"claims": [{"name": "g"}]},
                                 "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                 "volumes": [{"name": "kube-api-access-x", "projected": {}}]}}}}
pathlib.Path("corpus/admission/review.json").write_text(json.dumps(review))
PY
for target in resolve_tree inject decode admission; do
    echo "== $target for ${secs}s"
    cargo fuzz run --release "$target" "corpus/$target" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | tail -n 4
done
