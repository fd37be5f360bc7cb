{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "unstick.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; the release name alone when it already contains the chart's. */}}
{{- define "unstick.fullname" -}}
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

{{- define "unstick.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "unstick.labels" -}}
helm.sh/chart: {{ include "unstick.chart" . }}
{{ include "unstick.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: unstick
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "unstick.selectorLabels" -}}
app.kubernetes.io/name: {{ include "unstick.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Per-component labels: call with (dict "root" $ "component" "controller"). */}}
{{- define "unstick.componentLabels" -}}
{{ include "unstick.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "unstick.componentSelectorLabels" -}}
{{ include "unstick.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The ValidatingAdmissionPolicy and its binding (docs/admission.md). */}}
{{- define "unstick.admission.name" -}}
{{- printf "%s-remediation-writers" (include "unstick.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "unstick.controller.fullname" -}}
{{- printf "%s-controller" (include "unstick.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "unstick.agent.fullname" -}}
{{- printf "%s-agent" (include "unstick.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "unstick.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "unstick.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "unstick.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "unstick.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image both components run: repository:tag, or repository@digest. */}}
{{- define "unstick.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The pod's affinity, and with controller.separateFromAgents.enabled a required node affinity
on its label: the controller only on nodes with it (operator Exists), the agent only on
nodes without it (DoesNotExist), so the controller never shares a node — and its kubelet
root, where its token lies — with an agent (docs/install.md). Call with (dict "affinity"
.. "separate" .. "operator" "Exists|DoesNotExist" "what" "controller|agent").
*/}}
{{- define "unstick.separatedAffinity" -}}
{{- $affinity := deepCopy (.affinity | default dict) -}}
{{- if .separate.enabled -}}
{{- if hasKey $affinity "nodeAffinity" -}}
{{- fail (printf "%s.affinity.nodeAffinity cannot be combined with controller.separateFromAgents.enabled: put the node rule in controller.separateFromAgents.nodeLabel's nodes, or turn it off" .what) -}}
{{- end -}}
{{- $expr := dict "key" .separate.nodeLabel "operator" .operator -}}
{{- $terms := list (dict "matchExpressions" (list $expr)) -}}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) -}}
{{- end -}}
{{- with $affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
{{- end }}
{{- end -}}
