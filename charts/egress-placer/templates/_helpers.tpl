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
