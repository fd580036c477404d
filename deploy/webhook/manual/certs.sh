#!/usr/bin/env bash
# Certificates for the drafs webhook without cert-manager: a CA and a serving
# certificate for the webhook's Service, made with openssl into this
# directory, and the patch that puts the CA into the webhook configuration.
# Then: kubectl apply -k deploy/webhook/manual
# Run it again before the serving certificate expires (DAYS, default 365) and
# apply again: the CA (ca.crt, ca.key: CA_DAYS, default 3650) is kept and only
# the serving certificate is reissued, so caBundle stays the same and the API
# server trusts the old and the new certificate alike while the webhook
# reloads the renewed Secret (no refused pod). Delete ca.key to start over
# with a new CA (then apply at once: until every replica serves the new
# certificate, the API server refuses it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
days="${DAYS:-365}"
service=drafs-webhook.drafs-system.svc
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -s ca.key ] || [ ! -s ca.crt ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "${CA_DAYS:-3650}" \
        -subj "/CN=drafs-webhook-ca" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
    mv "$tmp/ca.key" "$tmp/ca.crt" "$here/"
    echo "made a new CA (ca.crt, ca.key); keep ca.key private and here for renewals"
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$service" \
    -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$service" "$service" >"$tmp/tls.ext"
openssl x509 -req -days "$days" -in "$tmp/tls.csr" -CA ca.crt -CAkey ca.key \
    -set_serial "0x$(openssl rand -hex 8)" -extfile "$tmp/tls.ext" -out "$tmp/tls.crt" 2>/dev/null
# Every entry of the configuration trusts the CA (pods.drafs.dev, namespaces.drafs.dev).
bundle=$(base64 -w0 <ca.crt)
cat >"$tmp/cabundle.yaml" <<PATCH
- op: add
  path: /webhooks/0/clientConfig/caBundle
  value: $bundle
- op: add
  path: /webhooks/1/clientConfig/caBundle
  value: $bundle
PATCH
mv "$tmp/tls.crt" "$tmp/tls.key" "$tmp/cabundle.yaml" "$here/"
echo "wrote $here/{tls.crt,tls.key,cabundle.yaml} (CA: ca.crt); now: kubectl apply -k $here"
