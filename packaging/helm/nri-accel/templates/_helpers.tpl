{{/* The release's name: every object is named after it (nri-accel, nri-accel-device-plugin). */}}
{{- define "nri-accel.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nri-accel.selector" -}}
app.kubernetes.io/name: nri-accel
app.kubernetes.io/instance: {{ include "nri-accel.name" . }}
{{- end -}}

{{- define "nri-accel.labels" -}}
{{ include "nri-accel.selector" . }}
{{- if not .Values.plain }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- end -}}

{{- define "nri-accel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The service account of the DaemonSet: only the DRA role talks to the API server. */}}
{{- define "nri-accel.serviceAccount" -}}
{{ include "nri-accel.name" . }}
{{- end -}}

{{/* config.yaml: the paths the DaemonSet mounts, the pools and the roles' sections. */}}
{{- define "nri-accel.config" -}}
state_dir: /var/lib/nri-accel
nri:
  socket: /var/run/nri/nri.sock
claims_api:
  socket: /run/nri-accel/claims.sock
cdi:
  dir: /var/run/cdi
{{- if or .Values.hostRoot .Values.discovery }}
discovery:
{{- if .Values.hostRoot }}
  # The host's /sys, /proc/driver and /dev are mounted under {{ .Values.hostRoot }}.
  root: {{ .Values.hostRoot }}
{{- end }}
{{- with .Values.discovery }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}
pools:
{{ toYaml .Values.pools | indent 2 }}
{{- if .Values.roles.dra.enabled }}
dra:
  enabled: true
  driver_name: {{ .Values.roles.dra.driverName }}
{{- with .Values.roles.dra.pools }}
  pools: {{ toJson . }}
{{- end }}
  claim_status: {{ .Values.roles.dra.claimStatus }}
  # The kubelet's dirs, at the same paths in the pod: the kubelet dials what is registered.
  plugins_registry_dir: {{ .Values.host.kubeletDir }}/plugins_registry
  plugins_dir: {{ .Values.host.kubeletDir }}/plugins
kubernetes:
  node_name: ""     # $NODE_NAME, set from spec.nodeName
  kubeconfig: null  # the pod's service account
{{- end }}
{{- if .Values.roles.devicePlugin.enabled }}
device_plugin:
  enabled: true
  resource_prefix: {{ .Values.roles.devicePlugin.resourcePrefix }}
  dir: {{ .Values.host.kubeletDir }}/device-plugins
{{- with .Values.roles.devicePlugin.config }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}
{{- if or .Values.metrics.enabled .Values.probes.enabled }}
metrics:
  # Loopback only; the probes ask it through `nri-accel probe`.
  listen: 127.0.0.1:{{ .Values.metrics.port }}
{{- end }}
{{- with .Values.extraConfig }}
{{ toYaml . }}
{{- end }}
{{- end -}}


{{/* Fails the render when DRA and the device plugin would serve one pool: the scheduler would
count the same devices twice, through ResourceSlices and through the extended resource. */}}
{{- define "nri-accel.checkRoles" -}}
{{- if and .Values.roles.dra.enabled .Values.roles.devicePlugin.enabled }}
{{- $dp := .Values.roles.devicePlugin.config.pools | default list }}
{{- $dra := .Values.roles.dra.pools | default list }}
{{- if or (empty $dp) (empty $dra) }}
{{- fail "roles.dra and roles.devicePlugin are both enabled without saying which pools each serves: each would serve every pool, so the scheduler counts the same devices twice; set roles.dra.pools and roles.devicePlugin.config.pools to disjoint lists of pool names, or turn one role off" }}
{{- end }}
{{- range $dp }}
{{- if has . $dra }}
{{- fail (printf "pool %q is in both roles.dra.pools and roles.devicePlugin.config.pools: one pool is served by one door, or the scheduler counts its devices twice; remove it from one list" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The DaemonSet's node affinity: the operator's label, or any of node-feature-discovery's
PCI labels when nodeFeatureDiscovery.enabled. */}}
{{- define "nri-accel.nodeAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - { key: {{ .Values.nodeLabel | quote }}, operator: In, values: ["true"] }
      {{- range .Values.nodeFeatureDiscovery.labels }}
      - matchExpressions:
          - { key: {{ . | quote }}, operator: In, values: ["true"] }
      {{- end }}
{{- end -}}
