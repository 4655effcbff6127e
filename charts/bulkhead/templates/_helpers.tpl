{{/* The release's full name: <release>, or <release>-<chart> when the release name does not contain the chart's. */}}
{{- define "bulkhead.fullname" -}}
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

{{- define "bulkhead.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bulkhead.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bulkhead.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hub
{{- end -}}

{{- define "bulkhead.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "bulkhead.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bulkhead
{{- end -}}

{{- define "bulkhead.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bulkhead.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "bulkhead.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "bulkhead.leaseName" -}}
{{- default (printf "%s-hub-leader" (include "bulkhead.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* The webhook configurations' base name: <fullname>-validating and <fullname>-mutating. */}}
{{- define "bulkhead.webhookConfigurationName" -}}
{{- include "bulkhead.fullname" . -}}
{{- end -}}

{{- define "bulkhead.webhookServiceName" -}}
{{- printf "%s-webhook" (include "bulkhead.fullname" .) -}}
{{- end -}}

{{- define "bulkhead.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "bulkhead.fullname" .) -}}
{{- end -}}

{{/* DNS names of the webhook Service, for its serving certificate. */}}
{{- define "bulkhead.webhookDnsNames" -}}
{{- $service := include "bulkhead.webhookServiceName" . -}}
{{- $names := list (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) -}}
{{- concat $names .Values.webhook.certificates.extraDnsNames | toJson -}}
{{- end -}}

{{/* Whether the webhook's certificate comes from files (cert-manager's Secret). */}}
{{- define "bulkhead.webhookCertificateFiles" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificates.mode "certManager") -}}true{{- end -}}
{{- end -}}

{{/* The Secret the hub processes keep the webhook's certificates in (chart mode). */}}
{{- define "bulkhead.webhookCertificateSecretName" -}}
{{- printf "%s-webhook-certs" (include "bulkhead.fullname" .) -}}
{{- end -}}
