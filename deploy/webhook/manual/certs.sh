#!/usr/bin/env bash
# Certificates for the drafs webhook without cert-manager: a CA and a serving
# certificate for the webhook's Service, made with openssl into this
# directory, and the patch that puts the CA into the webhook configuration.
# Then: kubectl apply -k deploy/webhook/manual
# Run it again before the certificate expires (DAYS, default 365) and apply
# again: the webhook reloads the renewed Secret without a restart.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
days="${DAYS:-365}"
service=drafs-webhook.drafs-system.svc
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
    -subj "/CN=drafs-webhook-ca" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$service" \
    -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$service" "$service" >"$tmp/tls.ext"
openssl x509 -req -days "$days" -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -extfile "$tmp/tls.ext" -out "$tmp/tls.crt" 2>/dev/null
cat >"$tmp/cabundle.yaml" <<PATCH
- op: add
  path: /webhooks/0/clientConfig/caBundle
  value: $(base64 -w0 <"$tmp/ca.crt")
PATCH
# The CA key is not kept: a renewal makes a new CA and a new bundle.
mv "$tmp/tls.crt" "$tmp/tls.key" "$tmp/ca.crt" "$tmp/cabundle.yaml" "$here/"
echo "wrote $here/{tls.crt,tls.key,ca.crt,cabundle.yaml}; now: kubectl apply -k $here"
