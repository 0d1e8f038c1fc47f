{{/*
Names. The defaults make a release named "gputopo" in gputopo-system produce
the names the components assume by default (gputopo-extender,
gputopo-nodeagent, ...), which is also what certs/ contains.
*/}}
{{- define "gputopo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gputopo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Component names: <fullname>-<component>. */}}
{{- define "gputopo.webhook.name" -}}{{ include "gputopo.fullname" . }}-webhook{{- end }}
{{- define "gputopo.extender.name" -}}{{ include "gputopo.fullname" . }}-extender{{- end }}
{{- define "gputopo.scheduler.name" -}}{{ include "gputopo.fullname" . }}-scheduler{{- end }}
{{- define "gputopo.nodeagent.name" -}}{{ include "gputopo.fullname" . }}-nodeagent{{- end }}

{{/* cert-manager object names. */}}
{{- define "gputopo.selfSignedIssuer" -}}{{ include "gputopo.fullname" . }}-selfsigned{{- end }}
{{- define "gputopo.caName" -}}{{ include "gputopo.fullname" . }}-ca{{- end }}
{{- define "gputopo.webhook.certificate" -}}{{ include "gputopo.fullname" . }}-webhook{{- end }}
{{- define "gputopo.webhook.secret" -}}{{ include "gputopo.fullname" . }}-webhook-tls{{- end }}

{{- define "gputopo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; selector labels add the component. */}}
{{- define "gputopo.labels" -}}
helm.sh/chart: {{ include "gputopo.chart" . }}
app.kubernetes.io/name: {{ include "gputopo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gputopo
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Call with (dict "root" $ "component" "extender"). */}}
{{- define "gputopo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gputopo.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gputopo.componentLabels" -}}
{{ include "gputopo.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The gputopo image reference. */}}
{{- define "gputopo.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end }}

{{/* Service account user names as the apiserver reports them. */}}
{{- define "gputopo.extender.user" -}}system:serviceaccount:{{ .Release.Namespace }}:{{ include "gputopo.extender.name" . }}{{- end }}
{{- define "gputopo.nodeagent.user" -}}system:serviceaccount:{{ .Release.Namespace }}:{{ include "gputopo.nodeagent.name" . }}{{- end }}

{{/*
Namespaces the webhooks never see, in the order webhook.Registration builds
them: kube-system, the release namespace, then the configured ones.
*/}}
{{- define "gputopo.webhook.excludedNamespaces" -}}
{{- $out := list "kube-system" }}
{{- range (prepend (.Values.webhook.excludedNamespaces | default list) .Release.Namespace) }}
{{- if and . (not (has . $out)) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Pod anti-affinity spreading replicas of one component over nodes. */}}
{{- define "gputopo.spread" -}}
podAntiAffinity:
  {{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "gputopo.selectorLabels" . | nindent 10 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gputopo.selectorLabels" . | nindent 12 }}
  {{- end }}
{{- end }}

{{/* Restricted pod security for the components that need no privileges. */}}
{{- define "gputopo.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Fail rendering with a message naming the value and the fix. */}}
{{- define "gputopo.validate" -}}
{{- $t := int .Values.webhook.timeoutSeconds }}
{{- if or (lt $t 1) (gt $t 5) }}
{{- fail (printf "webhook.timeoutSeconds: %d is out of range; must be between 1 and 5 (pod creation waits on the webhook)" $t) }}
{{- end }}
{{- if not (has .Values.extender.antiAffinity (list "soft" "hard")) }}
{{- fail (printf "extender.antiAffinity: %q is not supported; use soft or hard" .Values.extender.antiAffinity) }}
{{- end }}
{{- if not (has .Values.nodeAgent.nvmlAccess (list "runtimeClass" "privileged")) }}
{{- fail (printf "nodeAgent.nvmlAccess: %q is not supported; use runtimeClass or privileged" .Values.nodeAgent.nvmlAccess) }}
{{- end }}
{{- if and .Values.certManager.issuer.name (not (has .Values.certManager.issuer.kind (list "Issuer" "ClusterIssuer"))) }}
{{- fail (printf "certManager.issuer.kind: %q is not supported; use Issuer or ClusterIssuer" .Values.certManager.issuer.kind) }}
{{- end }}
{{- if ne .Values.webhook.schedulerName .Values.scheduler.schedulerName }}
{{- fail (printf "webhook.schedulerName (%q) must equal scheduler.schedulerName (%q): the webhook sends GPU pods to the profile the scheduler runs" .Values.webhook.schedulerName .Values.scheduler.schedulerName) }}
{{- end }}
{{- if lt (int .Values.extender.replicas) 1 }}
{{- fail "extender.replicas: must be at least 1; GPU pods wait while no extender serves" }}
{{- end }}
{{- end }}
