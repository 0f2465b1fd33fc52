{{/* Chart name. */}}
{{- define "sd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name if it already contains the chart name. */}}
{{- define "sd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* chart-version, as helm.sh/chart expects it (no "+", at most 63 characters). */}}
{{- define "sd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The standard labels of every object (and of the pods): helm.sh/chart and the
app.kubernetes.io/ name, instance, version, component and managed-by. The selector keeps
name and instance only: a Deployment's selector cannot change on upgrade.
*/}}
{{- define "sd.labels" -}}
helm.sh/chart: {{ include "sd.chart" . }}
{{ include "sd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sd.serviceAccountName" -}}
{{- default (include "sd.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "sd.leaseName" -}}
{{- default (include "sd.fullname" .) .Values.leaderElection.id -}}
{{- end -}}

{{- define "sd.leaderElection" -}}
{{- if gt (int .Values.replicas) 1 -}}
{{- if not .Values.leaderElection.enabled -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true: two writers would race" -}}
{{- end -}}
true
{{- else if .Values.leaderElection.enabled -}}
true
{{- end -}}
{{- end -}}

{{- define "sd.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/*
The controller's arguments: the scope, leader election and bind addresses this chart manages,
then every set key of .Values.controller as --kebab-case-name[=value], then extraArgs.
*/}}
{{- define "sd.args" -}}
{{- if eq .Values.scope "namespace" }}
- --localOnly
{{- else if ne .Values.scope "cluster" }}
{{- fail (printf "scope must be cluster or namespace, not %q" .Values.scope) }}
{{- end }}
{{- if include "sd.leaderElection" . }}
- --leader-elect
{{- $lease := include "sd.leaseName" . }}
{{- if ne $lease "statefulset-scaledown-controller" }}
- --leader-election-id={{ $lease }}
{{- end }}
{{- with .Values.leaderElection.namespace }}
- --leader-election-namespace={{ . }}
{{- end }}
{{- with .Values.leaderElection.leaseDuration }}
- --leader-elect-lease-duration={{ . }}
{{- end }}
{{- with .Values.leaderElection.renewDeadline }}
- --leader-elect-renew-deadline={{ . }}
{{- end }}
{{- with .Values.leaderElection.retryPeriod }}
- --leader-elect-retry-period={{ . }}
{{- end }}
{{- end }}
{{- if ne (int .Values.metrics.port) 8080 }}
- --metrics-bind-address={{ if eq (int .Values.metrics.port) 0 }}0{{ else }}:{{ .Values.metrics.port }}{{ end }}
{{- end }}
{{- if ne (int .Values.health.port) 8081 }}
- --health-probe-bind-address=:{{ .Values.health.port }}
{{- end }}
{{- range $key, $value := .Values.controller }}
{{- if kindIs "bool" $value }}
{{- if $value }}
- --{{ kebabcase $key }}
{{- end }}
{{- else if and (not (kindIs "invalid" $value)) (ne (toString $value) "") }}
- --{{ kebabcase $key }}={{ $value }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
