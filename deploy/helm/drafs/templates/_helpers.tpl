{{/* The name of every object: the release's, shortened to a DNS label. */}}
{{- define "drafs.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "drafs.webhook" -}}{{ include "drafs.fullname" . }}-webhook{{- end -}}

{{- define "drafs.selectorLabels" -}}
app.kubernetes.io/name: drafs-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* What every object of the release carries besides its name and instance. */}}
{{- define "drafs.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "drafs.labels" -}}
{{ include "drafs.selectorLabels" . }}
{{ include "drafs.commonLabels" . }}
{{- end -}}

{{/* One image for the webhook and for the container it injects. */}}
{{- define "drafs.image" -}}
{{- with .Values.image.registry }}{{ trimSuffix "/" . }}/{{ end -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* The pods' imagePullSecrets, from names or {name: ...}. */}}
{{- define "drafs.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
- name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The name the API server calls, which the serving certificate must cover. */}}
{{- define "drafs.dnsName" -}}
{{ include "drafs.webhook" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "drafs.tlsSecret" -}}
{{- if eq .Values.certificate.source "secret" -}}
{{- required "certificate.secretName is required with certificate.source=secret" .Values.certificate.secretName -}}
{{- else -}}
{{ include "drafs.webhook" . }}-tls
{{- end -}}
{{- end -}}

{{/*
The generated CA and serving certificate. The CA is kept in a Secret of its
own and reused on every upgrade (looked up), so caBundle never changes; the
serving certificate is reissued from it. Rendered once per release operation
and shared by the Secrets and the webhook configuration.
*/}}
{{- define "drafs.generated" -}}
{{- $caName := printf "%s-ca" (include "drafs.webhook" .) -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $caName -}}
{{- $ca := dict -}}
{{- if and $existing (index ($existing.data | default dict) "tls.crt") -}}
{{- $ca = buildCustomCert (index $existing.data "tls.crt") (index $existing.data "tls.key") -}}
{{- else -}}
{{- $ca = genCA (printf "%s CA" (include "drafs.webhook" .)) (int .Values.certificate.caValidityDays) -}}
{{- end -}}
{{- $dns := include "drafs.dnsName" . -}}
{{- $leaf := genSignedCert $dns nil (list $dns (printf "%s.cluster.local" $dns)) (int .Values.certificate.validityDays) $ca -}}
{{- dict "caCert" $ca.Cert "caKey" $ca.Key "cert" $leaf.Cert "key" $leaf.Key | toJson -}}
{{- end -}}

{{/* One entry of the MutatingWebhookConfiguration: root, path, caBundle. */}}
{{- define "drafs.webhookEntry" -}}
admissionReviewVersions: [v1]
clientConfig:
  {{- with .root.Values.webhookURL }}
  url: {{ printf "%s%s" (trimSuffix "/" .) $.path }}
  {{- else }}
  service:
    namespace: {{ .root.Release.Namespace }}
    name: {{ include "drafs.webhook" .root }}
    path: {{ .path }}
    port: 443
  {{- end }}
  {{- with .caBundle }}
  caBundle: {{ . }}
  {{- end }}
rules:
- operations: [CREATE]
  apiGroups: [""]
  apiVersions: [v1]
  resources: [pods]
  scope: Namespaced
failurePolicy: {{ .root.Values.failurePolicy }}
sideEffects: None
timeoutSeconds: {{ .root.Values.timeoutSeconds }}
matchPolicy: Equivalent
# The patch is complete in one call; a second finds drafs there and changes nothing.
reinvocationPolicy: Never
{{- end -}}

{{- define "drafs.node" -}}{{ include "drafs.fullname" . }}-node{{- end -}}

{{- define "drafs.nodeSelectorLabels" -}}
app.kubernetes.io/name: drafs-node
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "drafs.nodeLabels" -}}
{{ include "drafs.nodeSelectorLabels" . }}
{{ include "drafs.commonLabels" . }}
{{- end -}}

{{/* The uninstall guard's: its own name, so that no workload's selector adopts its pod. */}}
{{- define "drafs.uninstallGuardLabels" -}}
app.kubernetes.io/name: drafs-uninstall-guard
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "drafs.commonLabels" . }}
{{- end -}}

{{/* host:port from (list host port), an IPv6 host in brackets. */}}
{{- define "drafs.hostPort" -}}
{{- $host := toString (index . 0) -}}
{{- if contains ":" $host -}}[{{ $host }}]:{{ index . 1 }}{{- else -}}{{ $host }}:{{ index . 1 }}{{- end -}}
{{- end -}}

{{/* "true" when the agent's /metrics listens beyond its pod's loopback. */}}
{{- define "drafs.nodeMetricsExposed" -}}
{{- $host := toString .Values.node.metricsBindAddress -}}
{{- if not (or (hasPrefix "127." $host) (eq $host "::1") (eq $host "localhost")) -}}true{{- end -}}
{{- end -}}

{{/* The pod securityContext of the chart's non-root pods (restricted): the
image's user, except on OpenShift, where restricted-v2 assigns the namespace's. */}}
{{- define "drafs.restrictedPodSecurity" -}}
runAsNonRoot: true
{{- if not (include "drafs.openshift" .) }}
runAsUser: 65532
runAsGroup: 65532
{{- end }}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Their containers' securityContext (restricted). */}}
{{- define "drafs.restrictedContainerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* "true" on OpenShift: openshift true, or auto where the cluster serves security.openshift.io/v1. */}}
{{- define "drafs.openshift" -}}
{{- $o := .Values.openshift -}}
{{- if or (eq (toString $o) "true") (and (eq (toString $o) "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}true{{- end -}}
{{- end -}}
