#!/usr/bin/env bash
# Fuzz drafs's input handling: `fuzz/run.sh [SECONDS]` runs each target
# (resolve_tree, inject, decode, admission, status_data, health, extended,
# yaml, x509, csi) for SECONDS (default 60) with cargo fuzz, seeded from the
# project's examples and a few hand-written inputs. Needs cargo-fuzz (`cargo
# install cargo-fuzz`); RUSTC_BOOTSTRAP lets the stable toolchain take cargo
# fuzz's -Z flags. `fuzz/build.sh` only builds them.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
targets=(resolve_tree inject decode admission status_data health extended yaml x509 csi)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for target in "${targets[@]}"; do mkdir -p "corpus/$target"; done
cp ../examples/offline/*.yaml corpus/resolve_tree/
cp ../tests/inject/*.yaml corpus/inject/
for f in ../examples/*/*.yaml; do rel=${f#../examples/}; cp "$f" "corpus/inject/${rel//\//_}"; cp "$f" "corpus/yaml/${rel//\//_}"; done
python3 - <<'PY'
import glob, json, pathlib

def write(target, name, content):
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    pathlib.Path(f"corpus/{target}/{name}").write_bytes(data)

slice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
         "spec": {"driver": "gpu.example.com", "nodeName": "n", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "g1", "attributes": {"uuid": {"string": "U"}}}, {"name": "g2"}]}}
write("decode", "slice.json", slice)
claim = {"metadata": {"name": "c"}, "spec": {}, "status": {"allocation": {"devices": {"results": [
    {"request": "r", "driver": "d", "pool": "p", "device": "x"}]}}, "devices": [
    {"driver": "d", "pool": "p", "device": "x", "data": {"a": {"b": [1, 2]}}, "networkData": {"interfaceName": "eth0"}}]}}
write("decode", "claim.json", claim)

# admission: the first byte picks the webhook's path (0: /mutate, 1-4:
# /mutate/namespace with init, sidecar-fuse, sidecar-files, csi), the rest is the body.
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"drafs.dev/inject": "sidecar-fuse"},
        "annotations": {"drafs.dev/metadata-dir": "/m", "drafs.dev/require": "a/b/0/c", "drafs.dev/timeout": "1m"}},
        "spec": {"serviceAccountName": "default", "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}],
                 "containers": [{"name": "a", "resources": {"claims": [{"name": "g"}]},
                                 "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                 "volumes": [{"name": "kube-api-access-x", "projected": {}}]}}
def review(pod):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": pod}}).encode()
unlabelled = json.loads(json.dumps(pod))
del unlabelled["metadata"]["labels"]
extended = json.loads(json.dumps(unlabelled))
del extended["spec"]["resourceClaims"]
extended["spec"]["containers"][0]["resources"] = {"limits": {"gpu.example.com/gpu": "1"}}
for selector in range(4):
    write("admission", f"review-{selector}.json", bytes([selector]) + review(pod))
    write("admission", f"unlabelled-{selector}.json", bytes([selector]) + review(unlabelled))
    write("admission", f"extended-{selector}.json", bytes([selector]) + review(extended))

# health, extended, status_data: the Pods (and the claims' status data) of the offline examples.
try:
    import yaml
    docs = [d for f in sorted(glob.glob("../examples/offline/*.yaml")) for d in yaml.safe_load_all(open(f)) if d]
except ImportError:
    docs = []
for i, doc in enumerate(docs):
    if doc.get("kind") == "Pod":
        write("health", f"pod-{i}.json", doc)
        write("extended", f"pod-{i}.json", doc)
    for j, device in enumerate((doc.get("status") or {}).get("devices") or []):
        if doc.get("kind") == "ResourceClaim" and "data" in device:
            write("status_data", f"data-{i}-{j}.json", device["data"])
write("health", "hand.json", {"metadata": {"name": "p"}, "status": {"containerStatuses": [
    {"name": "app", "image": "i", "imageID": "", "ready": True, "restartCount": 0, "allocatedResourcesStatus": [
        {"name": "claim:gpu/gpu", "resources": [{"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Healthy"},
                                                {"resourceID": "vendor/gpu=b", "health": "Unhealthy", "message": "XID 79"}]},
        {"name": "claim:other", "resources": [{"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Unknown"}]}]}]}})
write("extended", "hand.json", {"metadata": {"name": "p"},
    "spec": {"initContainers": [{"name": "setup", "resources": {"limits": {"gpu.example.com/gpu": "1"}}}],
             "containers": [{"name": "app", "resources": {"limits": {"gpu.example.com/gpu": "1"}}}]},
    "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-abcde", "requestMappings": [
        {"containerName": "setup", "resourceName": "gpu.example.com/gpu", "requestName": "container-0-request-0"},
        {"containerName": "app", "resourceName": "gpu.example.com/gpu", "requestName": "container-1-request-0"},
        {"containerName": "app", "resourceName": "../../etc", "requestName": "container-1-request-1"}]}}})
write("status_data", "hand.json", {"mig": {"uuid": "MIG-1", "profile": "1g.10gb"}, "vf": ["0000:3b:00.2", 7, True],
    "bad/key": 1, ".hidden": 2, "deep": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}})

# x509: a certificate's skeleton in DER, the validity period in both time encodings.
def der(tag, content):
    n = len(content)
    length = bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + length + content
for name, not_before, not_after in [("utc", der(0x17, b"200101000000Z"), der(0x17, b"300101000000Z")),
                                    ("generalized", der(0x17, b"200101000000Z"), der(0x18, b"20510101000000Z"))]:
    tbs = der(0x30, der(0xa0, der(0x02, b"\x02")) + der(0x02, b"\x01") + der(0x30, b"") + der(0x30, b"")
              + der(0x30, not_before + not_after) + der(0x30, b"") + der(0x30, b""))
    write("x509", f"{name}.der", der(0x30, tbs + der(0x30, b"") + der(0x03, b"\x00")))
# csi: a publish request as the kubelet sends it (protobuf, by hand) and an
# HTTP/2 header block with a socket path as :authority.
def field(n, b):
    out = bytearray([n << 3 | 2]); l = len(b)
    while l >= 0x80: out.append(l & 0x7f | 0x80); l >>= 7
    out.append(l); return bytes(out) + b
ctx = {"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.name": "app",
       "csi.storage.k8s.io/pod.namespace": "ml", "csi.storage.k8s.io/pod.uid": "u1",
       "csi.storage.k8s.io/serviceAccount.tokens": json.dumps({"": {"token": "t.t.t"}}), "require": "gpu/gpu/0/uuid"}
req = field(1, b"v1") + field(4, b"/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/dra/mount") + bytes([6 << 3, 1])
for k, v in ctx.items():
    req += field(8, field(1, k.encode()) + field(2, v.encode()))
write("csi", "publish.bin", req)
path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdrafs.dev-reg.sock"
write("csi", "headers.bin", bytes([0x83, 0x41, len(path)]) + path + bytes([0x86]))
PY
# Real certificates, when openssl is there (the second one's notAfter is a GeneralizedTime).
if command -v openssl >/dev/null; then
    for days in 365 10000; do
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout /dev/null \
            -subj /CN=drafs-webhook.drafs.svc -days "$days" -outform DER -out "corpus/x509/openssl-$days.der" 2>/dev/null || true
    done
fi
# Every target runs even when one crashes; a crash's input is in artifacts/TARGET/,
# its whole log in target/fuzz-logs/TARGET.log.
mkdir -p target/fuzz-logs
failed=()
for target in "${targets[@]}"; do
    echo "== $target for ${secs}s"
    log="target/fuzz-logs/$target.log"
    if cargo fuzz run --release "$target" "corpus/$target" -- -max_total_time="$secs" -rss_limit_mb=2048 >"$log" 2>&1; then
        grep -E '^Done [0-9]+ runs' "$log" || tail -n 4 "$log"
    else
        failed+=("$target")
        grep -E -A1 "panicked at|^==[0-9]+== ERROR|Test unit written to|^Done [0-9]+ runs" "$log" | grep -v '^--$' | head -n 8
    fi
done
if ((${#failed[@]})); then
    echo "crashed: ${failed[*]} (logs in fuzz/target/fuzz-logs/, inputs in fuzz/artifacts/)"
    exit 1
fi
