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
{{- define "gputopo.extender.certificate" -}}{{ include "gputopo.fullname" . }}-extender{{- end }}
{{- define "gputopo.extender.secret" -}}{{ include "gputopo.fullname" . }}-extender-tls{{- end }}
{{- define "gputopo.scheduler.clientCertificate" -}}{{ include "gputopo.fullname" . }}-scheduler-client{{- end }}
{{- define "gputopo.scheduler.clientSecret" -}}{{ include "gputopo.fullname" . }}-scheduler-client-tls{{- end }}

{{/*
Where the TLS Secrets are mounted: the extender's serving Secret (also the
shadow's) and gputopo-scheduler's client Secret. Each holds tls.crt,
tls.key and ca.crt, as cert-manager writes them.
*/}}
{{- define "gputopo.extender.tlsDir" -}}/etc/gputopo/tls{{- end }}
{{- define "gputopo.scheduler.tlsDir" -}}/etc/kubernetes/gputopo-scheduler-tls{{- end }}

{{/* issuerRef of every Certificate the chart's CA or the existing issuer signs. */}}
{{- define "gputopo.issuerRef" -}}
{{- if .Values.certManager.issuer.name }}
name: {{ .Values.certManager.issuer.name }}
kind: {{ .Values.certManager.issuer.kind }}
group: {{ .Values.certManager.issuer.group }}
{{- else }}
name: {{ include "gputopo.caName" . }}
kind: Issuer
group: cert-manager.io
{{- end }}
{{- end }}

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

{{/*
"true" when the verbs are served with mutual TLS (extender.tls.enabled,
default true: a release upgraded with --reuse-values from a chart without
the value gets TLS), else empty.
*/}}
{{- define "gputopo.extender.tls.enabled" -}}
{{- $tls := include "gputopo.withDefaults" (dict "v" .Values.extender.tls "defaults" (dict "enabled" true)) | fromJson }}
{{- if and $tls.enabled (not (include "gputopo.scheduler.plugin" .)) }}true{{ end }}
{{- end }}

{{/*
"true" in plugin mode (scheduler.mode: plugin): gputopo-scheduler decides
GPU pods in-process and no extender Deployment serves verbs; else empty.
*/}}
{{- define "gputopo.scheduler.plugin" -}}
{{- if eq (.Values.scheduler.mode | default "extender") "plugin" }}true{{ end }}
{{- end }}

{{/* Name and scheme of the extender's verbs port: https with TLS, else http. */}}
{{- define "gputopo.extender.scheme" -}}
{{- if include "gputopo.extender.tls.enabled" . }}https{{ else }}http{{ end }}
{{- end }}

{{/* networkPolicy with its defaults, as JSON. */}}
{{- define "gputopo.networkPolicy" -}}
{{- include "gputopo.withDefaults" (dict "v" .Values.networkPolicy "defaults" (dict "enabled" false "metricsFrom" list "extenderFrom" list)) }}
{{- end }}

{{/*
The GPUs' extended resource name, the one every component is given:
gpuResourceName, or its deprecated alias nodeAgent.resourceName when
gpuResourceName stays at the default (gputopo.validate refuses two
different names).
*/}}
{{- define "gputopo.gpuResourceName" -}}
{{- $name := .Values.gpuResourceName | default "nvidia.com/gpu" }}
{{- $alias := (.Values.nodeAgent | default dict).resourceName | default "" }}
{{- if and $alias (eq $name "nvidia.com/gpu") }}{{ $alias }}{{ else }}{{ $name }}{{ end }}
{{- end }}

{{/*
The kube-scheduler image: scheduler.image.tag, or the cluster's own
version v<major>.<minor>.<patch> (any vendor suffix such as -eks-... or
+k3s1 dropped: upstream publishes only the plain versions).
*/}}
{{- define "gputopo.scheduler.imageTag" -}}
{{- if .Values.scheduler.image.tag }}
{{- .Values.scheduler.image.tag }}
{{- else }}
{{- $v := semver .Capabilities.KubeVersion.Version }}
{{- printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end }}
{{- end }}

{{- define "gputopo.scheduler.image" -}}
{{ .Values.scheduler.image.repository }}:{{ include "gputopo.scheduler.imageTag" . }}
{{- end }}

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
{{ include "gputopo.extender.scheme" . }}://{{ include "gputopo.shadowExtender.name" . }}.{{ .Release.Namespace }}.svc:{{ int .Values.extender.port }}
{{- end -}}
{{- end }}

{{/*
DNS names of a Service: the four forms clients use. Call with (dict "name"
<service> "namespace" <namespace>); one name per line, each "- <name>".
*/}}
{{- define "gputopo.serviceDNSNames" -}}
- {{ .name }}
- {{ .name }}.{{ .namespace }}
- {{ .name }}.{{ .namespace }}.svc
- {{ .name }}.{{ .namespace }}.svc.cluster.local
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
{{- if not (has (.Values.scheduler.mode | default "extender") (list "extender" "plugin")) }}
{{- fail (printf "scheduler.mode: %q is not supported; use extender (kube-scheduler calls the extender over HTTP) or plugin (gputopo-scheduler decides in-process)" .Values.scheduler.mode) }}
{{- end }}
{{- if include "gputopo.scheduler.plugin" . }}
{{- if lt (int .Values.scheduler.replicas) 1 }}
{{- fail "scheduler.replicas: must be at least 1 in plugin mode; GPU pods wait while no gputopo-scheduler runs" }}
{{- end }}
{{- if or (include "gputopo.shadowExtender.enabled" .) (include "gputopo.extender.shadow" . | fromJson).url }}
{{- fail "extender.shadow and shadowExtender: the shadow mirrors the extender's verbs and needs scheduler.mode extender; turn the shadow off or use extender mode" }}
{{- end }}
{{- else if lt (int .Values.extender.replicas) 1 }}
{{- fail "extender.replicas: must be at least 1; GPU pods wait while no extender serves" }}
{{- end }}
{{- range $key := list "kubeAPIQPS" "kubeAPIBurst" }}
{{- if lt (float64 (index $.Values.extender $key | default 0)) 0.0 }}
{{- fail (printf "extender.%s: %v must be 0 (the in-cluster client's default) or positive" $key (index $.Values.extender $key)) }}
{{- end }}
{{- end }}
{{- include "gputopo.validate.gpuResourceName" . }}
{{- include "gputopo.validate.kubeVersion" . }}
{{- $np := include "gputopo.networkPolicy" . | fromJson }}
{{- range $key := list "metricsFrom" "extenderFrom" }}
{{- $peers := index $np $key }}
{{- if and $peers (not (kindIs "slice" $peers)) }}
{{- fail (printf "networkPolicy.%s: must be a list of NetworkPolicyPeers (namespaceSelector, podSelector or ipBlock), got %s" $key (toJson (index $np $key))) }}
{{- end }}
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

{{/*
The GPU resource name must be an extended resource (a domain-prefixed name
outside kubernetes.io), and gpuResourceName and its deprecated alias
nodeAgent.resourceName must not name two different resources.
*/}}
{{- define "gputopo.validate.gpuResourceName" -}}
{{- $name := .Values.gpuResourceName | default "nvidia.com/gpu" }}
{{- $alias := (.Values.nodeAgent | default dict).resourceName | default "" }}
{{- if and $alias (ne $name "nvidia.com/gpu") (ne $alias $name) }}
{{- fail (printf "nodeAgent.resourceName (%q) and gpuResourceName (%q) differ: nodeAgent.resourceName is a deprecated alias; set only gpuResourceName" $alias $name) }}
{{- end }}
{{- $r := include "gputopo.gpuResourceName" . }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $r) }}
{{- fail (printf "gpuResourceName: %q is not an extended resource name; use a domain-prefixed name such as nvidia.com/gpu" $r) }}
{{- end }}
{{- if or (hasSuffix "kubernetes.io" (first (splitList "/" $r))) (hasPrefix "requests." $r) }}
{{- fail (printf "gpuResourceName: %q is reserved for Kubernetes' own resources; use a vendor domain such as nvidia.com/gpu" $r) }}
{{- end }}
{{- end }}

{{/*
The cluster must be one the chart supports (Chart.yaml kubeVersion), and
kube-scheduler must not be newer than the API server nor more than one
minor version older (Kubernetes' version skew policy). Every supported
version reads kubescheduler.config.k8s.io/v1 (GA since 1.25).
*/}}
{{- define "gputopo.validate.kubeVersion" -}}
{{- $kv := .Capabilities.KubeVersion.Version }}
{{- if not (semverCompare .Chart.KubeVersion $kv) }}
{{- fail (printf "Kubernetes %s is outside the versions this chart supports (%s); gputopo-scheduler runs kube-scheduler of the cluster's version with the kubescheduler.config.k8s.io/v1 configuration" $kv .Chart.KubeVersion) }}
{{- end }}
{{- $tag := .Values.scheduler.image.tag }}
{{- if and $tag (regexMatch "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $tag) }}
{{- $c := semver $kv }}
{{- $s := semver (regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $tag) }}
{{- if or (ne $s.Major $c.Major) (gt $s.Minor $c.Minor) }}
{{- fail (printf "scheduler.image.tag: %s is newer than the cluster (Kubernetes %s); kube-scheduler must not be newer than the API server. Leave the tag empty to run the cluster's version" $tag $kv) }}
{{- end }}
{{- if gt (sub $c.Minor $s.Minor) 1 }}
{{- fail (printf "scheduler.image.tag: %s is more than one minor version older than the cluster (Kubernetes %s); leave the tag empty to run the cluster's version" $tag $kv) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The node agent's device list strategies as a JSON list, deduplicated:
nodeAgent.deviceListStrategy is a name, comma-separated names, or a list.
*/}}
{{- define "gputopo.nodeAgent.deviceListStrategies" -}}
{{- $strategyValue := .Values.nodeAgent.deviceListStrategy }}
{{- if kindIs "string" $strategyValue }}
{{- $strategyValue = splitList "," $strategyValue }}
{{- else if not (kindIs "slice" $strategyValue) }}
{{- fail (printf "nodeAgent.deviceListStrategy: %v is not a strategy name or a list of them; use envvar, volume-mounts or cdi-cri" $strategyValue) }}
{{- end }}
{{- $strategies := list }}
{{- range $strategyValue }}
{{- $s := toString . | trim }}
{{- if not (has $s (list "envvar" "volume-mounts" "cdi-cri")) }}
{{- fail (printf "nodeAgent.deviceListStrategy: %q is not supported; use envvar, volume-mounts or cdi-cri (several as a list or comma-separated)" $s) }}
{{- end }}
{{- $strategies = append $strategies $s | uniq }}
{{- end }}
{{- if not $strategies }}
{{- fail "nodeAgent.deviceListStrategy: empty; name at least one of envvar, volume-mounts or cdi-cri" }}
{{- end }}
{{- toJson $strategies }}
{{- end }}

{{/*
The decider Lease (extender.DeciderLeaseName): one gputopo scheduler
decides a GPU resource per cluster.
*/}}
{{- define "gputopo.deciderLease.name" -}}
{{- .Values.deciderLease.name | default (printf "gputopo-decider-%s" (include "gputopo.gpuResourceName" . | lower | replace "/" "-" | replace "_" "-")) }}
{{- end }}
