{{/* The name: the chart's, or nameOverride. */}}
{{- define "adc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release
name when it holds the chart's name, else release-chart.
*/}}
{{- define "adc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The selector: the name only, as manifests/base selects. */}}
{{- define "adc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "adc.name" . }}
{{- end }}

{{/* Helm's labels. */}}
{{- define "adc.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The labels of the controller's own objects. */}}
{{- define "adc.labels" -}}
{{ include "adc.selectorLabels" . }}
app.kubernetes.io/component: controller
{{ include "adc.helmLabels" . }}
{{- end }}

{{/* The labels of the monitoring objects (not the controller's). */}}
{{- define "adc.monitoringLabels" -}}
{{ include "adc.selectorLabels" . }}
{{ include "adc.helmLabels" . }}
{{- end }}

{{- define "adc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "adc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace of the Lease. */}}
{{- define "adc.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}

{{/* The Lease the controller takes: its own in shadow mode. */}}
{{- define "adc.leaseName" -}}
{{- if .Values.shadow.enabled }}
{{- printf "%s-shadow" .Values.leaderElection.resourceName }}
{{- else }}
{{- .Values.leaderElection.resourceName }}
{{- end }}
{{- end }}

{{/* The Service that serves /metrics and /explain. */}}
{{- define "adc.serviceName" -}}
{{- printf "%s-metrics" (include "adc.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image: a digest wins over the tag; the tag defaults to appVersion. */}}
{{- define "adc.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* A ServiceAccount subject of the controller. */}}
{{- define "adc.subject" -}}
- kind: ServiceAccount
  name: {{ include "adc.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
