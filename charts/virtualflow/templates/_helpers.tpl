{{/*
Names and labels shared by every template. Names are DNS-1123 labels of at most 63 characters.
*/}}

{{/* The chart's name: "virtualflow" unless nameOverride. */}}
{{- define "virtualflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's prefix: the release name when it already holds the chart name (a release named
"virtualflow" gives "virtualflow"), else "<release>-<chart>"; fullnameOverride replaces it.
Kept to 53 characters so that suffixes such as "-operator" fit in 63.
*/}}
{{- define "virtualflow.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 53 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's Deployment, Service and (by default) ServiceAccount: "virtualflow-operator". */}}
{{- define "virtualflow.operatorName" -}}
{{- printf "%s-operator" (include "virtualflow.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "virtualflow-0.1.0", for the helm.sh/chart label. */}}
{{- define "virtualflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The recommended labels (app.kubernetes.io/*) plus helm.sh/chart, on every object the chart
renders. Call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "virtualflow.labels" -}}
helm.sh/chart: {{ include "virtualflow.chart" .ctx }}
{{ include "virtualflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: virtualflow
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/* The labels that select the operator's pods (never change them: selectors are immutable). */}}
{{- define "virtualflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "virtualflow.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "virtualflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "virtualflow.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference; the tag defaults to the chart's appVersion. Call with (list $ .image). */}}
{{- define "virtualflow.image" -}}
{{- $ctx := index . 0 }}
{{- $image := index . 1 }}
{{- $tag := default $ctx.Chart.AppVersion $image.tag }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" $image.repository $tag }}
{{- else }}
{{- printf "%s:%s" $image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The coordinator's URL as worker pods use it: the Service's cluster DNS name in the release
namespace.
*/}}
{{- define "virtualflow.coordinatorURL" -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" .Values.coordinator.tls.enabled) (include "virtualflow.operatorName" .) .Release.Namespace (int .Values.coordinator.port) }}
{{- end }}

{{/*
The coordinator's memory budget (--coordinator-memory-budget): coordinator.memoryBudget when set;
else half of resources.limits.memory, in bytes (the other half for the operator's caches and
requests); else nothing, and the operator takes half its container's cgroup limit, at most 1Gi.
The limit must then be an integer with at most one of the suffixes Ki, Mi, Gi, Ti, k, M, G, T.
*/}}
{{- define "virtualflow.coordinatorMemoryBudget" -}}
{{- if .Values.coordinator.memoryBudget }}
{{- .Values.coordinator.memoryBudget }}
{{- else }}
{{- $limit := "" }}
{{- with .Values.resources }}{{ with .limits }}{{ with .memory }}
{{- if kindIs "float64" . }}{{ $limit = int64 . | toString }}{{ else }}{{ $limit = toString . }}{{ end }}
{{- end }}{{ end }}{{ end }}
{{- if $limit }}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $limit) }}
{{- fail (printf "resources.limits.memory %q: write it as an integer with at most a suffix Ki, Mi, Gi, Ti, k, M, G or T, or set coordinator.memoryBudget" $limit) }}
{{- end }}
{{- $number := regexReplaceAll "[^0-9].*$" $limit "" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" $limit "" }}
{{- $scale := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) $unit }}
{{- div (mul $number $scale) 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the coordinator's CA and certificate, in the release namespace. */}}
{{- define "virtualflow.tlsSecretName" -}}
{{- default (printf "%s-coordinator-tls" (include "virtualflow.fullname" .)) .Values.coordinator.tls.secretName }}
{{- end }}

{{/*
"true" when the operator gives each job a NetworkPolicy of its own (networkPolicy.enabled and
networkPolicy.perJob), else "" (which `if` reads as false).
*/}}
{{- define "virtualflow.perJobNetworkPolicy" -}}
{{- if and .Values.networkPolicy.enabled .Values.networkPolicy.perJob }}true{{ end }}
{{- end }}

{{/* The Secret holding the key every job's secret is derived from, in the release namespace. */}}
{{- define "virtualflow.jobKeySecretName" -}}
{{- printf "%s-job-key" (include "virtualflow.fullname" .) }}
{{- end }}

{{/* The namespaces whose worker pods get a NetworkPolicy. */}}
{{- define "virtualflow.jobNamespaces" -}}
{{- if .Values.networkPolicy.jobNamespaces }}
{{- toJson .Values.networkPolicy.jobNamespaces }}
{{- else if .Values.watchNamespace }}
{{- toJson (list .Values.watchNamespace) }}
{{- else }}
{{- toJson (list) }}
{{- end }}
{{- end }}

{{/*
Checks across values that the schema cannot word well; each failure says what to change.
*/}}
{{- define "virtualflow.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: more than one operator would act on the same jobs; enable leader election or set replicaCount to 1" (int .Values.replicaCount)) }}
{{- end }}
{{- if eq (int .Values.coordinator.port) (int .Values.metrics.port) }}
{{- fail (printf "coordinator.port and metrics.port are both %d: the coordinator and the metrics endpoint need a port each" (int .Values.coordinator.port)) }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) .Values.rbac.create (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.create is false and serviceAccount.name is empty: name the existing ServiceAccount the RBAC rules should be bound to" }}
{{- end }}
{{- end }}

{{/*
Name of the chart's cluster-scoped objects (ClusterRole, ClusterRoleBinding): prefixed with the
release namespace, so that releases of the same name in two namespaces (one operator per team
namespace, each with watchNamespace) do not collide.
*/}}
{{- define "virtualflow.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "virtualflow.operatorName" .) | trunc 253 | trimSuffix "-" }}
{{- end }}

{{/* The rules on the jobs' namespaces: everything but Nodes (cluster-scoped) and the Lease. */}}
{{- define "virtualflow.jobRules" -}}
# Watch jobs; write only their status (the spec belongs to the user); delete a finished job
# once its spec.runPolicy.ttlSecondsAfterFinished has passed, as batch/v1's TTL controller does.
- apiGroups: [virtualflow.io]
  resources: [virtualflowjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [virtualflow.io]
  resources: [virtualflowjobs/status]
  verbs: [get, update, patch]
# Worker pods: created and deleted as jobs grow and shrink, never modified.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# Each worker pod's credential Secret: created once, owned by its pod. Never read, listed or
# changed: a job's secret is derived from the job key in the release namespace.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# An Event for every resize.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if include "virtualflow.perJobNetworkPolicy" . }}
# Each job's NetworkPolicy: mirrored (list, watch), created before the job's first pod, written
# back when someone changed it. Never deleted: the garbage collector follows its owner reference.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, update]
{{- end }}
# Kueue admission (jobs labelled kueue.x-k8s.io/queue-name): the job's Workloads (a core and a
# unit per worker above replicas.min), created and mirrored; their status written as Kueue's
# job framework writes it (PodsReady; the reservation cleared after an eviction; Finished when
# the job ends); a unit deleted when its core is not admitted or the job ended. Never changed
# otherwise. Harmless where Kueue is not installed: the operator asks for Workloads only once a
# job names a queue.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
{{- end }}

{{/*
The GPU inventory, read cluster-wide even with watchNamespace: Nodes (allocatable
nvidia.com/gpu, the product label) and every Pod (other workloads hold GPUs too).
*/}}
{{- define "virtualflow.nodeRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
# The value of the priority class a job names (kueue.x-k8s.io/priority-class, or its pods'
# priorityClassName), for the priority of its Kueue Workloads.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloadpriorityclasses]
  verbs: [get]
# The node labels and tolerations of the ResourceFlavors Kueue admitted a job to, for its pods.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}
{{- define "virtualflow.inventoryRules" -}}
{{ include "virtualflow.nodeRules" . }}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
{{- end }}
