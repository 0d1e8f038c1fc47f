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
{{- define "gputopo.shadowExtender.name" -}}{{ include "gputopo.fullname" . }}-extender-shadow{{- end }}

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

{{/*
Image of the shadow extender: the chart's image, or the same repository
with shadowExtender.image.tag.
*/}}
{{- define "gputopo.shadowExtender.image" -}}
{{- if .Values.shadowExtender.image.tag -}}
{{ .Values.image.repository }}:{{ .Values.shadowExtender.image.tag }}
{{- else -}}
{{ include "gputopo.image" . }}
{{- end -}}
{{- end }}

{{/*
Deep merge of .src into .dst (a map, changed in place): maps merge key by
key; anything else in .src, 0, false and "" included, replaces what .dst
has (e.g. a weight switched off in the shadow).
*/}}
{{- define "gputopo.merge" -}}
{{- $dst := .dst }}
{{- range $k, $v := .src }}
{{- if and (kindIs "map" $v) (kindIs "map" (index $dst $k)) }}
{{- include "gputopo.merge" (dict "dst" (index $dst $k) "src" $v) }}
{{- else }}
{{- $_ := set $dst $k $v }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The extender values the shadow's ExtenderConfiguration is rendered from:
a copy of .Values.extender with shadowExtender.overrides merged over it,
as JSON (include returns a string; read it back with fromJson).
*/}}
{{- define "gputopo.shadowExtender.values" -}}
{{- $v := deepCopy .Values.extender }}
{{- include "gputopo.merge" (dict "dst" $v "src" (.Values.shadowExtender.overrides | default dict)) }}
{{- toJson $v }}
{{- end }}

{{/*
Values added after the chart's first release are read through the helpers
below, which fall back to the defaults when they are absent: helm upgrade
--reuse-values keeps the values of the chart a release was installed from,
without the new defaults.
*/}}

{{/* "true" when the shadow extender runs, else empty. */}}
{{- define "gputopo.shadowExtender.enabled" -}}
{{- if (.Values.shadowExtender | default dict).enabled }}true{{ end }}
{{- end }}

{{/*
A copy of the map .v with the keys of .defaults it lacks added, as JSON.
Only absent keys are filled: 0, false and "" stay as given.
*/}}
{{- define "gputopo.withDefaults" -}}
{{- $out := deepCopy (.v | default dict) }}
{{- range $k, $d := .defaults }}
{{- if not (hasKey $out $k) }}
{{- $_ := set $out $k $d }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* extender.shadow with its defaults, as JSON. */}}
{{- define "gputopo.extender.shadow" -}}
{{- include "gputopo.withDefaults" (dict "v" .Values.extender.shadow "defaults" (dict "url" "" "sampleRate" 1 "timeout" "2s")) }}
{{- end }}

{{/*
The telemetry block of extender values (call with the values) with its
default source, as JSON.
*/}}
{{- define "gputopo.extender.telemetry" -}}
{{- include "gputopo.withDefaults" (dict "v" .telemetry "defaults" (dict "source" "nodeGPUTopology")) }}
{{- end }}

{{/*
The URL the serving extender mirrors to: extender.shadow.url, else the
chart's shadow Service when shadowExtender.enabled, else empty (no
mirroring).
*/}}
{{- define "gputopo.extender.shadowURL" -}}
{{- $shadow := include "gputopo.extender.shadow" . | fromJson }}
{{- if $shadow.url -}}
{{ $shadow.url }}
{{- else if include "gputopo.shadowExtender.enabled" . -}}
http://{{ include "gputopo.shadowExtender.name" . }}.{{ .Release.Namespace }}.svc:{{ int .Values.extender.port }}
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
{{- include "gputopo.validate.extenderValues" (dict "v" .Values.extender "path" "extender") }}
{{- $shadow := include "gputopo.extender.shadow" . | fromJson }}
{{- $r := float64 $shadow.sampleRate }}
{{- if or (lt $r 0.0) (gt $r 1.0) }}
{{- fail (printf "extender.shadow.sampleRate: %v is out of range; must be between 0 and 1" $shadow.sampleRate) }}
{{- end }}
{{- if include "gputopo.shadowExtender.enabled" . }}
{{- if lt (int .Values.shadowExtender.replicas) 1 }}
{{- fail "shadowExtender.replicas: must be at least 1 while shadowExtender.enabled is true; set enabled false to remove the shadow" }}
{{- end }}
{{- $r := float64 .Values.shadowExtender.logSampleRate }}
{{- if or (lt $r 0.0) (gt $r 1.0) }}
{{- fail (printf "shadowExtender.logSampleRate: %v is out of range; must be between 0 and 1" .Values.shadowExtender.logSampleRate) }}
{{- end }}
{{- include "gputopo.validate.extenderValues" (dict "v" (include "gputopo.shadowExtender.values" . | fromJson) "path" "shadowExtender.overrides") }}
{{- end }}
{{- end }}

{{/*
Checks of extender values that the ExtenderConfiguration is rendered from.
Call with (dict "v" <values> "path" <where they come from, for messages>).
*/}}
{{- define "gputopo.validate.extenderValues" -}}
{{- $t := include "gputopo.extender.telemetry" .v | fromJson }}
{{- if not (has $t.source (list "nodeGPUTopology" "prometheus")) }}
{{- fail (printf "%s.telemetry.source: %q is not supported; use nodeGPUTopology or prometheus" .path $t.source) }}
{{- end }}
{{- if and (eq $t.source "prometheus") (not ($t.prometheus | default dict).url) }}
{{- fail (printf "%s.telemetry.prometheus.url: required with telemetry.source prometheus; set the URL of the Prometheus server that scrapes DCGM exporter, e.g. http://prometheus.monitoring:9090" .path) }}
{{- end }}
{{- end }}
