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
{{- coalesce .Values.namespaceOverride .Values.namespace.name .Release.Namespace -}}
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

{{/* The keys of the ConfigMap the chart ships: config.map's, or `default` (files/policy.yaml). */}}
{{- define "slicelet.configKeys" -}}
{{- if .Values.config.map -}}
{{- keys .Values.config.map | sortAlpha | join "," -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* "true" when the node label chooses the config (RBAC, NODE_NAME, a token and
SLICELET_CONFIG_LABEL), else "". As NVIDIA's chart: whenever a ConfigMap of the user's is in
use (config.map or config.name). config.nodeLabel.enabled: null (default) = that rule, false =
off (a slicelet extension), true = on, refused when there is no ConfigMap of the user's. */}}
{{- define "slicelet.labelSelection" -}}
{{- $hasConfigMap := or .Values.config.name .Values.config.map -}}
{{- $enabled := .Values.config.nodeLabel.enabled -}}
{{- if kindIs "invalid" $enabled -}}
{{- if $hasConfigMap -}}true{{- end -}}
{{- else if $enabled -}}
{{- if $hasConfigMap -}}
true
{{- else -}}
{{- fail "config.nodeLabel.enabled needs named configs to choose from: set config.map (one key per config) or config.name (an existing ConfigMap)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What the configs in config.map need, as JSON lists of config names: `mps` (sharing.mps),
`mig` (flags.migStrategy single or mixed), `cdi` (flags.plugin.deviceListStrategy with
cdi-annotations or cdi-cri, a string or a list), `memory` (a `memory` key on an entry of
sharing.timeSlicing.resources or sharing.mps.resources). A config that is not YAML is refused
here. */}}
{{- define "slicelet.configNeeds" -}}
{{- $needs := dict "mps" (list) "mig" (list) "cdi" (list) "memory" (list) -}}
{{- range $name, $text := .Values.config.map -}}
{{- $cfg := fromYaml (toString $text) -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "config.map.%s is not YAML: %s" $name (get $cfg "Error")) -}}
{{- end -}}
{{- if dig "sharing" "mps" "" $cfg -}}
{{- $_ := set $needs "mps" (append $needs.mps $name) -}}
{{- end -}}
{{- if has (toString (dig "flags" "migStrategy" "" $cfg)) (list "single" "mixed") -}}
{{- $_ := set $needs "mig" (append $needs.mig $name) -}}
{{- end -}}
{{- $dls := dig "flags" "plugin" "deviceListStrategy" "" $cfg -}}
{{- if kindIs "string" $dls -}}{{- $dls = splitList "," $dls -}}{{- end -}}
{{- if kindIs "slice" $dls -}}
{{- if or (has "cdi-annotations" $dls) (has "cdi-cri" $dls) -}}
{{- $_ := set $needs "cdi" (append $needs.cdi $name) -}}
{{- end -}}
{{- end -}}
{{- $memory := false -}}
{{- range $sharing := list "timeSlicing" "mps" -}}
{{- $entries := dig "sharing" $sharing "resources" list $cfg -}}
{{- if kindIs "slice" $entries -}}
{{- range $entry := $entries -}}
{{- if and (kindIs "map" $entry) (hasKey $entry "memory") -}}{{- $memory = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $memory -}}
{{- $_ := set $needs "memory" (append $needs.memory $name) -}}
{{- end -}}
{{- end -}}
{{- toJson $needs -}}
{{- end -}}

{{/* Each config of config.map checked as far as the template engine can, as slicelet reads
it (src/policy/schema.rs): YAML, `version` v1 when given (NVIDIA's and slicelet's default when
absent), only the top-level keys the policy has, only known `flags` keys, and in
sharing.timeSlicing and sharing.mps only their keys and their entries' keys, each entry with
`name` and `replicas` a whole number of at least 1 and `dra` true, false or capacity. The first
fault fails the render, naming the config and the field (`slicelet validate --config FILE`
checks the rest: names, device lists, quantities, what the node has). */}}
{{- define "slicelet.checkConfigs" -}}
{{- $top := list "version" "flags" "resources" "sharing" "imex" "health" "dra" -}}
{{- $flags := list "migStrategy" "failOnInitError" "restartOnDeviceUnhealthy" "nvidiaDriverRoot" "nvidiaDevRoot" "mpsRoot" "gdrcopyEnabled" "gdsEnabled" "mofedEnabled" "useNodeFeatureAPI" "deviceDiscoveryStrategy" "plugin" "gfd" -}}
{{- $entry := list "name" "rename" "devices" "replicas" "dra" "memory" -}}
{{- $sections := dict "timeSlicing" (dict "keys" (list "renameByDefault" "failRequestsGreaterThanOne" "resources") "entry" $entry) "mps" (dict "keys" (list "renameByDefault" "failRequestsGreaterThanOne" "exclusiveProcess" "allowPreVolta" "resources") "entry" (concat $entry (list "activeThreadPercentage" "pinnedDeviceMemoryLimit"))) -}}
{{- range $name, $text := .Values.config.map -}}
{{- $cfg := fromYaml (toString $text) -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "config.map.%s is not YAML: %s" $name (get $cfg "Error")) -}}
{{- end -}}
{{- $where := printf "config.map.%s" $name -}}
{{- range $key := keys $cfg | sortAlpha -}}
{{- if not (has $key $top) -}}
{{- fail (printf "%s: %s is not a key of a policy (its keys: %s)" $where $key (join ", " $top)) -}}
{{- end -}}
{{- end -}}
{{- if and (not (kindIs "invalid" (index $cfg "version"))) (ne (toString (index $cfg "version")) "v1") -}}
{{- fail (printf "%s: version %v: the only version is v1" $where (index $cfg "version")) -}}
{{- end -}}
{{- $f := index $cfg "flags" -}}
{{- if kindIs "map" $f -}}
{{- range $key := keys $f | sortAlpha -}}
{{- if not (has $key $flags) -}}
{{- fail (printf "%s: flags.%s is not a key of flags (its keys: %s)" $where $key (join ", " $flags)) -}}
{{- end -}}
{{- end -}}
{{- else if not (kindIs "invalid" $f) -}}
{{- fail (printf "%s: flags is not a map" $where) -}}
{{- end -}}
{{- $sharing := index $cfg "sharing" -}}
{{- if kindIs "map" $sharing -}}
{{- range $kind := keys $sharing | sortAlpha -}}
{{- if not (hasKey $sections $kind) -}}
{{- fail (printf "%s: sharing.%s is not a key of sharing (its keys: mps, timeSlicing)" $where $kind) -}}
{{- end -}}
{{- $rules := get $sections $kind -}}
{{- $section := index $sharing $kind -}}
{{- if kindIs "map" $section -}}
{{- range $key := keys $section | sortAlpha -}}
{{- if not (has $key $rules.keys) -}}
{{- fail (printf "%s: sharing.%s.%s is not a key of sharing.%s (its keys: %s)" $where $kind $key $kind (join ", " $rules.keys)) -}}
{{- end -}}
{{- end -}}
{{- $entries := index $section "resources" -}}
{{- if kindIs "slice" $entries -}}
{{- range $i, $e := $entries -}}
{{- $at := printf "sharing.%s.resources[%d]" $kind $i -}}
{{- if not (kindIs "map" $e) -}}
{{- fail (printf "%s: %s is not a map (name, replicas, ...)" $where $at) -}}
{{- end -}}
{{- range $key := keys $e | sortAlpha -}}
{{- if not (has $key $rules.entry) -}}
{{- fail (printf "%s: %s.%s is not a key of a sharing.%s entry (its keys: %s)" $where $at $key $kind (join ", " $rules.entry)) -}}
{{- end -}}
{{- end -}}
{{- if not (index $e "name") -}}
{{- fail (printf "%s: %s has no name (the resource shared, e.g. nvidia.com/gpu)" $where $at) -}}
{{- end -}}
{{- $replicas := index $e "replicas" -}}
{{- if not (and (kindIs "float64" $replicas) (ge $replicas 1.0) (eq (floor $replicas) $replicas)) -}}
{{- fail (printf "%s: %s.replicas %v: a whole number of replicas of at least 1 is required" $where $at (ternary "is missing" (toString $replicas) (kindIs "invalid" $replicas))) -}}
{{- end -}}
{{- if and (hasKey $e "dra") (not (has (toString (index $e "dra")) (list "true" "false" "capacity"))) -}}
{{- fail (printf "%s: %s.dra %v: true, false or capacity" $where $at (index $e "dra")) -}}
{{- end -}}
{{- end -}}
{{- else if not (kindIs "invalid" $entries) -}}
{{- fail (printf "%s: sharing.%s.resources is not a list" $where $kind) -}}
{{- end -}}
{{- else if not (kindIs "invalid" $section) -}}
{{- fail (printf "%s: sharing.%s is not a map" $where $kind) -}}
{{- end -}}
{{- end -}}
{{- else if not (kindIs "invalid" $sharing) -}}
{{- fail (printf "%s: sharing is not a map" $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The DRA resources of the chart's configs (config.map's, or files/policy.yaml without
it), as a sorted JSON list of names as slicelet advertises them: each `dra.resources` item and
the advertised name of every sharing.timeSlicing or sharing.mps entry with `dra: true` or
`dra: capacity` (one device per replica, or one shared device per GPU: both are DRA's; its
`rename`, else `<name>.shared` under that section's renameByDefault, else its `name`), with
`nvidia.com/` added to a name without `/`, as slicelet does. A config that is not YAML counts
as none here (slicelet.configNeeds refuses it). */}}
{{- define "slicelet.draResources" -}}
{{- $configs := .Values.config.map -}}
{{- if not $configs -}}{{- $configs = dict "default" (.Files.Get "files/policy.yaml") -}}{{- end -}}
{{- $names := list -}}
{{- range $_, $text := $configs -}}
{{- $cfg := fromYaml (toString $text) -}}
{{- if not (hasKey $cfg "Error") -}}
{{- $found := list -}}
{{- $dra := get $cfg "dra" -}}
{{- if kindIs "map" $dra -}}
{{- $listed := get $dra "resources" -}}
{{- if kindIs "slice" $listed -}}{{- $found = concat $found $listed -}}{{- end -}}
{{- end -}}
{{- $sharing := get $cfg "sharing" -}}
{{- if kindIs "map" $sharing -}}
{{- range $kind := list "timeSlicing" "mps" -}}
{{- $section := get $sharing $kind -}}
{{- if kindIs "map" $section -}}
{{- $entries := get $section "resources" -}}
{{- if kindIs "slice" $entries -}}
{{- range $e := $entries -}}
{{- if and (kindIs "map" $e) (has (toString (get $e "dra")) (list "true" "capacity")) -}}
{{- $advertised := toString (get $e "name") -}}
{{- if get $e "rename" -}}
{{- $advertised = toString (get $e "rename") -}}
{{- else if eq (toString (get $section "renameByDefault")) "true" -}}
{{- $advertised = printf "%s.shared" $advertised -}}
{{- end -}}
{{- $found = append $found $advertised -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $n := $found -}}
{{- $n = toString $n -}}
{{- if not (contains "/" $n) -}}{{- $n = printf "nvidia.com/%s" $n -}}{{- end -}}
{{- $names = append $names $n -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* The bridge DeviceClass of an extended resource name (dra.extendedResources); call with
(dict "name" NAME "driver" DRIVER): `<name with "/" and "." as "-">.bridge.<driver>`,
nvidia.com/gpu-shared -> nvidia-com-gpu-shared.bridge.gpu.slicelet.io. */}}
{{- define "slicelet.bridgeClassName" -}}
{{- printf "%s.bridge.%s" (regexReplaceAll "[/.]" .name "-") .driver -}}
{{- end -}}

{{/* Where the MPS daemons run: mps.mode, or, unset (null), `in-process` when a config in
config.map uses sharing.mps (the policy needs the daemons, as NVIDIA's chart starts its MPS
control daemon for such a config) and `none` otherwise. An explicit `none` with such a config
is refused. */}}
{{- define "slicelet.mpsMode" -}}
{{- $needs := include "slicelet.configNeeds" . | fromJson -}}
{{- if kindIs "invalid" .Values.mps.mode -}}
{{- ternary "in-process" "none" (gt (len $needs.mps) 0) -}}
{{- else -}}
{{- $mode := toString .Values.mps.mode -}}
{{- if not (has $mode (list "none" "in-process" "daemonset")) -}}
{{- fail (printf "mps.mode %q: must be none, in-process or daemonset" $mode) -}}
{{- end -}}
{{- if and (eq $mode "none") $needs.mps -}}
{{- fail (printf "config.map's %s use sharing.mps, which needs the MPS control daemons: set mps.mode to in-process or daemonset (or leave it unset: in-process), not none" (join ", " $needs.mps)) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}
{{- end -}}

{{/* Why the values need the MIG settings, or "". migLayouts.name: slicelet creates and
destroys MIG instances. Else NVIDIA's migStrategy, when set, overrides every config's
flags.migStrategy (MIG_STRATEGY beats the file); otherwise a config in config.map with
flags.migStrategy single or mixed. */}}
{{- define "slicelet.migNeeds" -}}
{{- if .Values.migLayouts.name -}}
migLayouts.name={{ .Values.migLayouts.name }} (slicelet creates and destroys MIG instances)
{{- else if typeIs "string" .Values.migStrategy -}}
{{- if has .Values.migStrategy (list "single" "mixed") -}}
migStrategy={{ .Values.migStrategy }}
{{- end -}}
{{- else -}}
{{- $needs := include "slicelet.configNeeds" . | fromJson -}}
{{- with $needs.mig -}}
config.map's {{ join ", " . }} (flags.migStrategy single or mixed)
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the MIG settings are on. mig.enabled true: on. Unset (null): on when the
values need them (slicelet.migNeeds) or, as NVIDIA's chart, when config.name names configs the
chart cannot read and migStrategy does not say `none`. false: off, refused when the values need
them. */}}
{{- define "slicelet.migEnabled" -}}
{{- $why := include "slicelet.migNeeds" . -}}
{{- $set := .Values.mig.enabled -}}
{{- if kindIs "invalid" $set -}}
{{- if or $why (and .Values.config.name (not (typeIs "string" .Values.migStrategy))) -}}true{{- end -}}
{{- else if $set -}}
true
{{- else if $why -}}
{{- fail (printf "%s needs the MIG settings (NVIDIA_MIG_MONITOR_DEVICES, CAP_SYS_ADMIN, the nvidia-caps mount): remove mig.enabled=false (unset, they follow the configs) or set mig.enabled=true" $why) -}}
{{- end -}}
{{- end -}}

{{/* "true" when slicelet watches its own Node through the API (the node-reader ClusterRole,
NODE_NAME, a token): node-label config selection (slicelet.labelSelection) or MIG layouts
(migLayouts.name: the nvidia.com/mig.config label names the layout), else "". */}}
{{- define "slicelet.nodeWatch" -}}
{{- if or (include "slicelet.labelSelection" .) .Values.migLayouts.name -}}true{{- end -}}
{{- end -}}

{{/* Why the values need the host's CDI spec directories, or "": NVIDIA's deviceListStrategy
(which overrides every config's) or a config's flags.plugin.deviceListStrategy with
cdi-annotations or cdi-cri (slicelet checks every CDI name it hands out against the specs). */}}
{{- define "slicelet.cdiNeeds" -}}
{{- if typeIs "string" .Values.deviceListStrategy -}}
{{- $dls := splitList "," .Values.deviceListStrategy -}}
{{- if or (has "cdi-annotations" $dls) (has "cdi-cri" $dls) -}}
deviceListStrategy={{ .Values.deviceListStrategy }}
{{- end -}}
{{- else -}}
{{- $needs := include "slicelet.configNeeds" . | fromJson -}}
{{- with $needs.cdi -}}
config.map's {{ join ", " . }} (flags.plugin.deviceListStrategy cdi-annotations or cdi-cri)
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the CDI spec directories are mounted. As mig.enabled: true on; null on when
needed or with config.name (NVIDIA's chart always mounts its CDI root) unless
deviceListStrategy says otherwise; false off, refused when needed. */}}
{{- define "slicelet.cdiEnabled" -}}
{{- $why := include "slicelet.cdiNeeds" . -}}
{{- $set := .Values.cdi.enabled -}}
{{- if kindIs "invalid" $set -}}
{{- if or $why (and .Values.config.name (not (typeIs "string" .Values.deviceListStrategy))) -}}true{{- end -}}
{{- else if $set -}}
true
{{- else if $why -}}
{{- fail (printf "%s needs the host's CDI spec directories (cdi.specDirs): remove cdi.enabled=false (unset, they follow the configs) or set cdi.enabled=true" $why) -}}
{{- end -}}
{{- end -}}

{{/* Why the values need the GPU memory-limit hook, or "": a config in config.map with
`memory` on a sharing entry (slicelet's CDI spec then names a createContainer hook the
container runtime runs from the host). */}}
{{- define "slicelet.memoryLimitsNeeds" -}}
{{- $needs := include "slicelet.configNeeds" . | fromJson -}}
{{- with $needs.memory -}}
config.map's {{ join ", " . }} (memory on a sharing entry)
{{- end -}}
{{- end -}}

{{/* "true" when the memory-limit hook is installed: the init container copies the binary to
memoryLimits.hookDir on the host, and the plugin writes its CDI spec to memoryLimits.specDir
(mounted read-write). memoryLimits.enabled true: on; null: on when a config needs it (with
config.name the chart cannot read the configs: set it); false: off, refused when a config
needs it. */}}
{{- define "slicelet.memoryLimitsEnabled" -}}
{{- $why := include "slicelet.memoryLimitsNeeds" . -}}
{{- $set := .Values.memoryLimits.enabled -}}
{{- if kindIs "invalid" $set -}}
{{- if $why -}}true{{- end -}}
{{- else if $set -}}
true
{{- else if $why -}}
{{- fail (printf "%s needs the GPU memory-limit hook (the slicelet binary on each node in memoryLimits.hookDir, the CDI spec directory memoryLimits.specDir read-write): remove memoryLimits.enabled=false (unset, it follows the configs) or set memoryLimits.enabled=true" $why) -}}
{{- end -}}
{{- end -}}

{{/* The hook binary's host path: memoryLimits.hookDir/slicelet. */}}
{{- define "slicelet.hookBinary" -}}
{{- printf "%s/slicelet" (trimSuffix "/" .Values.memoryLimits.hookDir) -}}
{{- end -}}

{{/* Pod scheduling shared by both DaemonSets. */}}
{{- define "slicelet.scheduling" -}}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
{{- if include "slicelet.migEnabled" . }}
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
{{ include "slicelet.nvidiaEnv" . }}
{{- end -}}

{{/* NVIDIA's chart's variables, set exactly when NVIDIA's chart sets them (MPS_ROOT always;
the others only for a value of the type NVIDIA's `typeIs` checks). Set, each overrides the
same flag of the config file, as in NVIDIA's plugin. */}}
{{- define "slicelet.nvidiaEnv" -}}
- name: MPS_ROOT
  value: {{ .Values.mps.root | quote }}
{{- range $pair := list (list "migStrategy" "MIG_STRATEGY" "string") (list "failOnInitError" "FAIL_ON_INIT_ERROR" "bool") (list "compatWithCPUManager" "PASS_DEVICE_SPECS" "bool") (list "deviceListStrategy" "DEVICE_LIST_STRATEGY" "string") (list "deviceIDStrategy" "DEVICE_ID_STRATEGY" "string") (list "nvidiaDriverRoot" "NVIDIA_DRIVER_ROOT" "string") (list "nvidiaDevRoot" "NVIDIA_DEV_ROOT" "string") (list "gdrcopyEnabled" "GDRCOPY_ENABLED" "bool") (list "gdsEnabled" "GDS_ENABLED" "bool") (list "mofedEnabled" "MOFED_ENABLED" "bool") (list "deviceDiscoveryStrategy" "DEVICE_DISCOVERY_STRATEGY" "string") }}
{{- $value := index $.Values (index $pair 0) }}
{{- if typeIs (index $pair 2) $value }}
- name: {{ index $pair 1 }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* NOTES' lines for the chart values that override the configs' own flags: each of
NVIDIA's top-level values that is set becomes the variable NVIDIA's chart sets (slicelet.nvidiaEnv),
which wins over that flag of every config on every node, as in NVIDIA's plugin; and mps.root
(MPS_ROOT, always set) where a config's flags.mpsRoot says otherwise. Each line names the configs
of config.map whose own flag differs. Empty when nothing is overridden. */}}
{{- define "slicelet.overrideNotes" -}}
{{- $configs := dict -}}
{{- range $name, $text := .Values.config.map -}}
{{- $cfg := fromYaml (toString $text) -}}
{{- if not (hasKey $cfg "Error") -}}{{- $_ := set $configs $name $cfg -}}{{- end -}}
{{- end -}}
{{- range $o := list (list "migStrategy" "MIG_STRATEGY" "string" "migStrategy") (list "failOnInitError" "FAIL_ON_INIT_ERROR" "bool" "failOnInitError") (list "compatWithCPUManager" "PASS_DEVICE_SPECS" "bool" "plugin.passDeviceSpecs") (list "deviceListStrategy" "DEVICE_LIST_STRATEGY" "string" "plugin.deviceListStrategy") (list "deviceIDStrategy" "DEVICE_ID_STRATEGY" "string" "plugin.deviceIDStrategy") (list "nvidiaDriverRoot" "NVIDIA_DRIVER_ROOT" "string" "nvidiaDriverRoot") (list "nvidiaDevRoot" "NVIDIA_DEV_ROOT" "string" "nvidiaDevRoot") (list "gdrcopyEnabled" "GDRCOPY_ENABLED" "bool" "gdrcopyEnabled") (list "gdsEnabled" "GDS_ENABLED" "bool" "gdsEnabled") (list "mofedEnabled" "MOFED_ENABLED" "bool" "mofedEnabled") (list "deviceDiscoveryStrategy" "DEVICE_DISCOVERY_STRATEGY" "string" "deviceDiscoveryStrategy") }}
{{- $value := index $.Values (index $o 0) }}
{{- if typeIs (index $o 2) $value }}
{{- $differ := list }}
{{- range $name, $cfg := $configs }}
{{- $own := dig "flags" "" $cfg }}
{{- range $part := splitList "." (index $o 3) }}
{{- if kindIs "map" $own }}{{- $own = dig $part "" $own }}{{- else }}{{- $own = "" }}{{- end }}
{{- end }}
{{- if kindIs "slice" $own }}{{- $own = join "," $own }}{{- end }}
{{- if and (ne (toString $own) "") (ne (toString $own) (toString $value)) }}
{{- $differ = append $differ (printf "%s says %v" $name $own) }}
{{- end }}
{{- end }}
  {{ index $o 0 }}={{ $value }}: {{ index $o 1 }}={{ $value }} on every node wins over flags.{{ index $o 3 }} of every config
{{- if $differ }} (config.map's {{ join ", " $differ }}){{ end }}
{{- if $.Values.config.name }} (the configs of {{ $.Values.config.name }}, which the chart cannot read){{ end }}
{{- end }}
{{- end }}
{{- range $name, $cfg := $configs }}
{{- $own := dig "flags" "mpsRoot" "" $cfg }}
{{- if and (ne (toString $own) "") (ne (toString $own) $.Values.mps.root) }}
  mps.root={{ $.Values.mps.root }}: MPS_ROOT={{ $.Values.mps.root }} on every node wins over config.map's {{ $name }} flags.mpsRoot ({{ $own }})
{{- end }}
{{- end }}
{{- end -}}

{{/* Mounts shared by both DaemonSets: the policy (a directory, never subPath: a subPath mount
never sees ConfigMap updates), the MIG caps, the simulated node. */}}
{{- define "slicelet.configMounts" -}}
- name: config
  mountPath: /etc/slicelet
  readOnly: true
{{- if include "slicelet.migEnabled" . }}
- name: nvidia-caps
  mountPath: /host/proc/driver/nvidia-caps
  readOnly: true
{{- end }}
{{- if .Values.simulate.enabled }}
- name: simulated-node
  mountPath: /etc/slicelet-node
  readOnly: true
{{- end }}
{{- if typeIs "string" .Values.nvidiaDriverRoot }}
# NVIDIA's nvidiaDriverRoot: the host's driver root, always at /driver-root (as NVIDIA's chart).
- name: driver-root
  mountPath: /driver-root
  readOnly: true
{{- end }}
{{- end -}}

{{- define "slicelet.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "slicelet.configMapName" . }}
{{- if include "slicelet.migEnabled" . }}
# Directory: the driver creates it (procfs); a node without it has no MIG to serve, and the
# pod says so (FailedMount) instead of getting an empty directory.
- name: nvidia-caps
  hostPath:
    path: /proc/driver/nvidia-caps
    type: Directory
{{- end }}
{{- if .Values.simulate.enabled }}
- name: simulated-node
  configMap:
    name: {{ include "slicelet.fullname" . }}-simulated-node
{{- end }}
{{- if typeIs "string" .Values.nvidiaDriverRoot }}
- name: driver-root
  hostPath:
    path: {{ .Values.nvidiaDriverRoot }}
    type: Directory
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
