{{/*
Configuration files of the components, rendered from values. Each is also
hashed into its Deployment's pod template so that a change rolls the pods.
*/}}

{{/* WebhookConfiguration, decoded strictly by configv1alpha1.ParseWebhook. */}}
{{- define "gputopo.webhook.config" -}}
apiVersion: config.gputopo.io/v1alpha1
kind: WebhookConfiguration
schedulerName: {{ .Values.webhook.schedulerName | quote }}
policyTable:
  {{- range $intent := list "model" "data" "none" }}
  {{- $p := index $.Values.webhook.policyTable $intent }}
  {{ $intent }}:
    strategy: {{ $p.strategy | quote }}
    requireNVLinkFromGPUs: {{ int $p.requireNVLinkFromGPUs }}
    minPairBandwidthGBps: {{ int $p.minPairBandwidthGBps }}
    {{- with $p.fallbackAfter }}
    fallbackAfter: {{ . | quote }}
    {{- end }}
  {{- end }}
systemServiceAccounts:
  - {{ include "gputopo.extender.user" . | quote }}
  - {{ include "gputopo.nodeagent.user" . | quote }}
  {{- range .Values.webhook.extraSystemServiceAccounts }}
  - {{ . | quote }}
  {{- end }}
nodeAgentServiceAccounts:
  - {{ include "gputopo.nodeagent.user" . | quote }}
resourceName: {{ include "gputopo.gpuResourceName" . | quote }}
gpuContainerEnvFrom: {{ .Values.webhook.gpuContainerEnvFrom | quote }}
excludedNamespaces: {{ include "gputopo.webhook.excludedNamespaces" . }}
namespaceDefaultAnnotation: {{ .Values.webhook.namespaceDefaultAnnotation | quote }}
claimDeviceClasses: {{ ((.Values.extender.dra | default dict).deviceClasses) | default (list "gpu.nvidia.com") | toJson }}
{{- end }}

{{/*
ExtenderConfiguration, decoded strictly by configv1alpha1.ParseExtender
(package api/config/v1alpha1). Call with (dict "v" <extender values>
"resourceName" <the GPU resource name>):
.Values.extender for the serving extender, or those values with
shadowExtender.overrides merged over them for the shadow
(gputopo.shadowExtender.values). gputopo.validate checks both before
anything is rendered.
*/}}
{{- define "gputopo.extender.config" -}}
{{- $v := .v -}}
apiVersion: config.gputopo.io/v1alpha1
kind: ExtenderConfiguration
weights:
  profile: {{ $v.weights.profile | default "placement" | quote }}
  {{- range $k := list "utilizationBalance" "taskAffinity" "thermalPowerHeadroom" "fragmentation" "bandwidthFit" "capabilityConservation" "islandBestFit" }}
  {{- $w := index $v.weights $k }}
  {{- if not (kindIs "invalid" $w) }}
  {{ $k }}: {{ int $w }}
  {{- end }}
  {{- end }}
thermal:
  idleTemperatureC: {{ int $v.thermal.idleTemperatureC }}
  limitTemperatureC: {{ int $v.thermal.limitTemperatureC }}
topologyMaxAge: {{ $v.topologyMaxAge | quote }}
telemetryMaxAge: {{ $v.telemetryMaxAge | quote }}
bindTimeout: {{ $v.bindTimeout | quote }}
reservationTTL: {{ $v.reservationTTL | quote }}
events:
  gpusBound: {{ (($v.events | default dict).gpusBound) | default false }}
{{- $pt := $v.patience | default dict }}
patience:
  bandwidthWait: {{ $pt.bandwidthWait | default "10m" | quote }}
  bandwidthPercent: {{ $pt.bandwidthPercent | default 50 }}
{{- $d := $v.dra | default dict }}
dra:
  driver: {{ $d.driver | default "gpu.nvidia.com" | quote }}
  uuidAttribute: {{ $d.uuidAttribute | default "uuid" | quote }}
  deviceClasses: {{ $d.deviceClasses | default (list "gpu.nvidia.com") | toJson }}
{{- $f := $v.fabric | default dict }}
fabric:
  groupReservationTTL: {{ $f.groupReservationTTL | default "2m" | quote }}
  reserveAfter: {{ $f.reserveAfter | default "0s" | quote }}
  reserveMaxPercent: {{ $f.reserveMaxPercent | default 25 }}
  reserveMaxDuration: {{ $f.reserveMaxDuration | default "30m" | quote }}
  {{- if $f.levels }}
  levels: {{ toJson $f.levels }}
  {{- end }}
resourceName: {{ .resourceName | quote }}
{{- $t := include "gputopo.extender.telemetry" $v | fromJson }}
telemetry:
  source: {{ $t.source | quote }}
  {{- if eq $t.source "prometheus" }}
  {{- $p := $t.prometheus }}
  prometheus:
    url: {{ $p.url | quote }}
    interval: {{ $p.interval | quote }}
    timeout: {{ $p.timeout | quote }}
    maxAge: {{ $p.maxAge | quote }}
    nodeLabel: {{ $p.nodeLabel | quote }}
    uuidLabel: {{ $p.uuidLabel | quote }}
    selector: {{ $p.selector | quote }}
    metrics:
      utilization: {{ $p.metrics.utilization | quote }}
      framebufferUsed: {{ $p.metrics.framebufferUsed | quote }}
      temperature: {{ $p.metrics.temperature | quote }}
      power: {{ $p.metrics.power | quote }}
      powerLimit: {{ $p.metrics.powerLimit | quote }}
  {{- end }}
{{- end }}

{{/*
KubeSchedulerConfiguration of gputopo-scheduler: files/scheduler-config.yaml
with the release's names and the values applied. The file stays the one
source of the extender wiring (verbs, nodeCacheCapable, managedResources);
it calls the extender over plain HTTP, as the tests' local extenders
serve, and the chart turns on HTTPS with a client certificate
(extender.tls.enabled): the scheduler presents the tls.crt of its client
Secret and verifies the extender against that Secret's ca.crt.
*/}}
{{- define "gputopo.scheduler.config" -}}
{{- if include "gputopo.scheduler.plugin" . }}
{{- include "gputopo.scheduler.pluginConfig" . }}
{{- else }}
{{- include "gputopo.scheduler.extenderConfig" . }}
{{- end }}
{{- end }}

{{/*
Where the scheduler pods mount the extender's ConfigMap in plugin mode: the
GPUTopology plugin reads the same ExtenderConfiguration.
*/}}
{{- define "gputopo.scheduler.decisionConfigDir" -}}/etc/gputopo/extender{{- end }}

{{/*
Plugin mode: files/scheduler-config-plugin.yaml with the release's names,
the score weight and the plugin's args (the extender's ConfigMap, mounted;
its metrics on extender.metricsPort).
*/}}
{{- define "gputopo.scheduler.pluginConfig" -}}
{{- $cfg := .Files.Get "files/scheduler-config-plugin.yaml" | fromYaml }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "files/scheduler-config-plugin.yaml: %s" $cfg.Error) }}
{{- end }}
{{- $_ := set $cfg.leaderElection "resourceName" (include "gputopo.scheduler.name" .) }}
{{- $_ := set $cfg.leaderElection "resourceNamespace" .Release.Namespace }}
{{- $profile := first $cfg.profiles }}
{{- $_ := set $profile "schedulerName" .Values.scheduler.schedulerName }}
{{- range $profile.plugins.score.enabled }}
{{- $_ := set . "weight" (int $.Values.scheduler.extenderWeight) }}
{{- end }}
{{- $args := (first $profile.pluginConfig).args }}
{{- $_ := set $args "configFile" (printf "%s/config.yaml" (include "gputopo.scheduler.decisionConfigDir" .)) }}
{{- $_ := set $args "metricsBindAddress" (printf ":%d" (int .Values.extender.metricsPort)) }}
{{- $_ := set $args "schedulerNames" (list .Values.scheduler.schedulerName) }}
{{- $_ := set $args "deciderLeaseNamespace" .Values.deciderLease.namespace }}
{{- $_ := set $args "deciderLeaseName" (include "gputopo.deciderLease.name" .) }}
{{- toYaml $cfg }}
{{- end }}

{{/* Extender mode: files/scheduler-config.yaml, see above. */}}
{{- define "gputopo.scheduler.extenderConfig" -}}
{{- $cfg := .Files.Get "files/scheduler-config.yaml" | fromYaml }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "files/scheduler-config.yaml: %s" $cfg.Error) }}
{{- end }}
{{- $_ := set $cfg.leaderElection "resourceName" (include "gputopo.scheduler.name" .) }}
{{- $_ := set $cfg.leaderElection "resourceNamespace" .Release.Namespace }}
{{- $profile := first $cfg.profiles }}
{{- $_ := set $profile "schedulerName" .Values.scheduler.schedulerName }}
{{- $ext := first $cfg.extenders }}
{{- $url := printf "%s://%s.%s.svc:%d/scheduler" (include "gputopo.extender.scheme" .) (include "gputopo.extender.name" .) .Release.Namespace (int .Values.extender.port) }}
{{- $_ := set $ext "urlPrefix" $url }}
{{- if include "gputopo.extender.tls.enabled" . }}
{{- $dir := include "gputopo.scheduler.tlsDir" . }}
{{- $_ := set $ext "enableHTTPS" true }}
{{- $_ := set $ext "tlsConfig" (dict "certFile" (printf "%s/tls.crt" $dir) "keyFile" (printf "%s/tls.key" $dir) "caFile" (printf "%s/ca.crt" $dir)) }}
{{- end }}
{{- $_ := set $ext "ignorable" .Values.scheduler.ignorable }}
{{- $_ := set $ext "httpTimeout" .Values.scheduler.extenderHTTPTimeout }}
{{- $_ := set $ext "weight" (int .Values.scheduler.extenderWeight) }}
{{- range $ext.managedResources }}
{{- $_ := set . "name" (include "gputopo.gpuResourceName" $) }}
{{- end }}
{{- if .Values.scheduler.extenderForClaimPods }}
{{- $_ := unset $ext "managedResources" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}
