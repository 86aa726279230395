{{/* The chart name (nameOverride). */}}
{{- define "slicelet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' base name: fullnameOverride, else the release name (containing the chart
name), else <release>-<chart>. Kept to 59 characters so "-mps" still fits in 63. */}}
{{- define "slicelet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 59 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "slicelet.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 59 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 59 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every object. */}}
{{- define "slicelet.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "slicelet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "slicelet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slicelet
{{- end -}}

{{/* Selector labels; call with (dict "ctx" $ "component" "device-plugin"). */}}
{{- define "slicelet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slicelet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "slicelet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The ConfigMap holding the named configs. */}}
{{- define "slicelet.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else -}}
{{- printf "%s-config" (include "slicelet.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the node label chooses the config (RBAC, NODE_NAME and a token), else "".
Refuses config.nodeLabel.enabled with a single inline config: there is nothing to choose. */}}
{{- define "slicelet.labelSelection" -}}
{{- if .Values.config.nodeLabel.enabled -}}
{{- if or .Values.config.name (gt (len .Values.config.map) 1) -}}
true
{{- else -}}
{{- fail "config.nodeLabel.enabled needs several named configs: config.map with two or more keys, or config.name (an existing ConfigMap)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* mps.mode, checked. */}}
{{- define "slicelet.mpsMode" -}}
{{- $mode := toString .Values.mps.mode -}}
{{- if not (has $mode (list "none" "in-process" "daemonset")) -}}
{{- fail (printf "mps.mode %q: must be none, in-process or daemonset" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* Pod scheduling shared by both DaemonSets. */}}
{{- define "slicelet.scheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- if .Values.simulate.enabled }}
nodeSelector:
  kubernetes.io/os: linux
  {{- with .Values.nodeSelector }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- else }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The policy and GPU source, shared by `slicelet run` and `slicelet mps` (the MPS daemons
must choose the same config as the plugin on the same node). */}}
{{- define "slicelet.configEnv" -}}
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: compute,utility
{{- if .Values.mig.enabled }}
- name: NVIDIA_MIG_MONITOR_DEVICES
  value: all
- name: SLICELET_PROC_ROOT
  value: /host
{{- end }}
- name: SLICELET_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: SLICELET_LOG
  value: {{ .Values.logLevel | quote }}
# A directory: each key of the ConfigMap is a named config.
- name: SLICELET_CONFIG
  value: /etc/slicelet
{{- with .Values.config.default }}
- name: SLICELET_CONFIG_DEFAULT
  value: {{ . | quote }}
{{- end }}
- name: SLICELET_CONFIG_FALLBACK
  value: {{ join "," .Values.config.fallbackStrategies | quote }}
{{- if include "slicelet.labelSelection" . }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: SLICELET_CONFIG_LABEL
  value: {{ .Values.config.nodeLabel.key | quote }}
{{- end }}
{{- if .Values.simulate.enabled }}
- name: SLICELET_SIMULATE
  value: /etc/slicelet-node/node.yaml
{{- end }}
{{- end -}}

{{/* Mounts shared by both DaemonSets: the policy (a directory, never subPath: a subPath mount
never sees ConfigMap updates), the MIG caps, the simulated node. */}}
{{- define "slicelet.configMounts" -}}
- name: config
  mountPath: /etc/slicelet
  readOnly: true
{{- if .Values.mig.enabled }}
- name: nvidia-caps
  mountPath: /host/proc/driver/nvidia-caps
  readOnly: true
{{- end }}
{{- if .Values.simulate.enabled }}
- name: simulated-node
  mountPath: /etc/slicelet-node
  readOnly: true
{{- end }}
{{- end -}}

{{- define "slicelet.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "slicelet.configMapName" . }}
{{- if .Values.mig.enabled }}
- name: nvidia-caps
  hostPath:
    path: /proc/driver/nvidia-caps
    type: DirectoryOrCreate
{{- end }}
{{- if .Values.simulate.enabled }}
- name: simulated-node
  configMap:
    name: {{ include "slicelet.fullname" . }}-simulated-node
{{- end }}
{{- end -}}

{{/* The MPS root and its shm directory (at /dev/shm: Allocate gives clients the same host
directory at /dev/shm). */}}
{{- define "slicelet.mpsMounts" -}}
- name: mps-root
  mountPath: {{ .Values.mps.root }}
{{- end -}}

{{- define "slicelet.mpsShmMount" -}}
- name: mps-shm
  mountPath: /dev/shm
{{- end -}}

{{- define "slicelet.mpsRootVolume" -}}
- name: mps-root
  hostPath:
    path: {{ .Values.mps.root }}
    type: DirectoryOrCreate
{{- end -}}

{{- define "slicelet.mpsShmVolume" -}}
- name: mps-shm
  hostPath:
    path: {{ printf "%s/shm" (trimSuffix "/" .Values.mps.root) }}
    type: DirectoryOrCreate
{{- end -}}
