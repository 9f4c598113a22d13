{{/* Name of the chart. */}}
{{- define "heterotrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release name + chart name, unless the release name has it. */}}
{{- define "heterotrain.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "heterotrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: heterotrain
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "heterotrain.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "heterotrain.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of the operator's objects: common labels + name + component. */}}
{{- define "heterotrain.operator.labels" -}}
{{ include "heterotrain.labels" . }}
app.kubernetes.io/name: {{ include "heterotrain.name" . }}-operator
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "heterotrain.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "heterotrain.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Trainer ServiceAccount name: fixed, the operator's default for rank pods. */}}
{{- define "heterotrain.trainer.serviceAccountName" -}}
heterotrain-trainer
{{- end }}

{{/* Watched namespaces as a list (default: the release namespace). */}}
{{- define "heterotrain.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson (uniq .Values.watchNamespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* repository:tag[@digest] with the tag defaulting to appVersion. */}}
{{- define "heterotrain.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" .image.repository $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/* Selector of every trainer pod the operator creates. */}}
{{- define "heterotrain.trainer.selector" -}}
matchLabels:
  app.kubernetes.io/managed-by: heterotrain-operator
matchExpressions:
  - {key: heterotrain.dev/job, operator: Exists}
{{- end }}

{{/* The ValidatingWebhookConfiguration (cluster-scoped: one per release namespace). */}}
{{- define "heterotrain.webhook.configurationName" -}}
{{- printf "%s-%s" (include "heterotrain.fullname" .) .Release.Namespace | trunc 253 -}}
{{- end }}
