{{/*
The controller's namespace: the release's (`helm install -n NAMESPACE`), or .Values.namespaceOverride.
k8s/ and the settings' defaults use egress-placer; the controller reads its own from the downward API
(EGRESS_PLACER_NAMESPACE).
*/}}
{{- define "egress-placer.namespace" -}}
{{ .Values.namespaceOverride | default .Release.Namespace }}
{{- end }}

{{/*
metadata.labels of an object: its own (`labels`, a dict; they win), Helm's standard labels, the
part-of label k8s/kustomization.yaml puts on every object, and .Values.commonLabels.
Call with (dict "root" $ "labels" (dict ...)).
*/}}
{{- define "egress-placer.labels" -}}
{{- $root := .root -}}
{{- $standard := dict
  "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")
  "app.kubernetes.io/managed-by" $root.Release.Service
  "app.kubernetes.io/instance" $root.Release.Name
  "app.kubernetes.io/version" $root.Chart.AppVersion
  "app.kubernetes.io/part-of" "egress-placer"
-}}
{{- toYaml (merge (deepCopy (.labels | default dict)) $standard (deepCopy $root.Values.commonLabels)) -}}
{{- end }}

{{/*
The labels that pick the controller's pods (Deployment, Service, PodDisruptionBudget, spread).
*/}}
{{- define "egress-placer.selectorLabels" -}}
app.kubernetes.io/name: egress-placer
app.kubernetes.io/component: controller
{{- end }}

{{/*
A whole `metadata:` block: name, namespace (when `namespaced`), labels, and annotations (its own, then
.Values.commonAnnotations) when there are any.
Call with (dict "root" $ "name" NAME "namespaced" BOOL ["namespace" NS] ["labels" (dict ...)] ["annotations" (dict ...)]).
*/}}
{{- define "egress-placer.metadata" -}}
metadata:
  name: {{ .name }}
  {{- if .namespace }}
  namespace: {{ .namespace }}
  {{- else if .namespaced }}
  namespace: {{ include "egress-placer.namespace" .root }}
  {{- end }}
  labels:
    {{- include "egress-placer.labels" . | nindent 4 }}
  {{- $annotations := merge (deepCopy (.annotations | default dict)) (deepCopy .root.Values.commonAnnotations) }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
The controller's ServiceAccount as a binding subject.
*/}}
{{- define "egress-placer.subject" -}}
- kind: ServiceAccount
  name: egress-placer
  namespace: {{ include "egress-placer.namespace" . }}
{{- end }}

{{/*
true when cert-manager keeps the webhook's certificate.
*/}}
{{- define "egress-placer.certManager" -}}
{{- if eq .Values.certificate.mode "cert-manager" }}true{{ end -}}
{{- end }}

{{/*
The controller's Prometheus credentials (.Values.prometheus.auth; docs/suggest.md, "Prometheus behind auth"):
the keys of the Secret existingSecret, each projected as a file of a fixed name under
/etc/egress-placer/prometheus, and the EGRESS_PLACER_PROMETHEUS_* settings naming those files. As YAML:
{items: [{key, path}], env: [{name, value}]}, both empty without a Secret. Refuses (fail) what the
controller's settings refuse (a token and basic auth, half of basic auth), after extraEnv, which may
replace these settings as it replaces the chart's others, and keys without a Secret or a Secret without keys.
*/}}
{{- define "egress-placer.prometheusAuth" -}}
{{- $auth := .Values.prometheus.auth }}
{{- $dir := "/etc/egress-placer/prometheus" }}
{{- $items := list }}
{{- $env := list }}
{{- if $auth.existingSecret }}
{{- if not (or $auth.tokenKey $auth.username $auth.passwordKey $auth.caKey) }}
{{- fail (printf "prometheus.auth.existingSecret %s: name its keys, prometheus.auth.tokenKey (a bearer token) or username and passwordKey (basic auth), and/or caKey (a CA bundle)" $auth.existingSecret) }}
{{- end }}
{{- range $file := list (list $auth.tokenKey "token" "EGRESS_PLACER_PROMETHEUS_TOKEN_FILE") (list $auth.passwordKey "password" "EGRESS_PLACER_PROMETHEUS_PASSWORD_FILE") (list $auth.caKey "ca.crt" "EGRESS_PLACER_PROMETHEUS_CA_FILE") }}
{{- if index $file 0 }}
{{- $items = append $items (dict "key" (index $file 0) "path" (index $file 1)) }}
{{- $env = append $env (dict "name" (index $file 2) "value" (printf "%s/%s" $dir (index $file 1))) }}
{{- end }}
{{- end }}
{{- with $auth.username }}
{{- $env = append $env (dict "name" "EGRESS_PLACER_PROMETHEUS_USERNAME" "value" .) }}
{{- end }}
{{- else if or $auth.tokenKey $auth.passwordKey $auth.caKey }}
{{- fail "prometheus.auth.tokenKey, passwordKey and caKey are keys of prometheus.auth.existingSecret: set it too (a Secret in the release's namespace)" }}
{{- end }}
{{- $set := dict }}
{{- range $env }}{{ $_ := set $set .name .value }}{{ end }}
{{- $set = merge (deepCopy .Values.extraEnv) $set }}
{{- $token := get $set "EGRESS_PLACER_PROMETHEUS_TOKEN_FILE" }}
{{- $user := get $set "EGRESS_PLACER_PROMETHEUS_USERNAME" }}
{{- $password := get $set "EGRESS_PLACER_PROMETHEUS_PASSWORD_FILE" }}
{{- if and $token (or $user $password) }}
{{- fail "Prometheus credentials: a bearer token (prometheus.auth.tokenKey) or basic auth (prometheus.auth.username and passwordKey), not both (extraEnv's EGRESS_PLACER_PROMETHEUS_* settings count too; docs/suggest.md, \"Prometheus behind auth\")" }}
{{- end }}
{{- if ne (not $user) (not $password) }}
{{- fail "Prometheus credentials: basic auth needs both prometheus.auth.username and prometheus.auth.passwordKey (extraEnv's EGRESS_PLACER_PROMETHEUS_* settings count too; docs/suggest.md, \"Prometheus behind auth\")" }}
{{- end }}
{{- toYaml (dict "items" $items "env" $env) }}
{{- end }}
