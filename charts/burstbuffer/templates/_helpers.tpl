{{/*
Names, labels and the values derived in more than one template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "burstbuffer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release-qualified name: fullnameOverride, or "<release>-<chart>", or just the
release name when it already contains the chart name (so `helm install burstbuffer`
does not make "burstbuffer-burstbuffer").
*/}}
{{- define "burstbuffer.fullname" -}}
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

{{/* The name shared by the injector's Deployment, Service, ConfigMap and webhook. */}}
{{- define "burstbuffer.injector.fullname" -}}
{{- printf "%s-injector" (include "burstbuffer.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "burstbuffer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "burstbuffer.labels" -}}
helm.sh/chart: {{ include "burstbuffer.chart" . }}
{{ include "burstbuffer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the injector pods (immutable in a Deployment: keep them few). */}}
{{- define "burstbuffer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "burstbuffer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: injector
{{- end }}

{{/* The injector's ServiceAccount. */}}
{{- define "burstbuffer.serviceAccountName" -}}
{{- if .Values.injector.serviceAccount.create }}
{{- default (include "burstbuffer.injector.fullname" .) .Values.injector.serviceAccount.name }}
{{- else }}
{{- required "injector.serviceAccount.name is required when injector.serviceAccount.create is false" .Values.injector.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "burstbuffer.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The Secret holding the injector's serving certificate (tls.crt, tls.key, ca.crt).
The two sources use different names so that switching between them never has Helm
delete a Secret that cert-manager has just written under the same name.
*/}}
{{- define "burstbuffer.tlsSecretName" -}}
{{- if .Values.certManager.enabled }}
{{- printf "%s-cert-manager-tls" (include "burstbuffer.injector.fullname" .) }}
{{- else }}
{{- printf "%s-tls" (include "burstbuffer.injector.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS names the API server may use to reach the injector Service. */}}
{{- define "burstbuffer.injector.dnsNames" -}}
{{- $service := include "burstbuffer.injector.fullname" . }}
{{- list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) | toJson }}
{{- end }}

{{/*
The injector's configuration document (ConfigMap key config.yaml): the sidecar
template from .Values.sidecar plus the image, and the parents and their CA from
.Values.parentCache. Its schema is the injector's (injector/settings.py); the chart
adds no key of its own.
*/}}
{{- define "burstbuffer.injector.config" -}}
{{- $config := deepCopy .Values.sidecar }}
{{- $_ := set $config "image" (include "burstbuffer.image" .) }}
{{- $_ = set $config "imagePullPolicy" .Values.image.pullPolicy }}
{{- $_ = set $config "parents" (include "burstbuffer.parent.urls" . | fromJsonArray) }}
{{- $_ = set $config "parentCA" .Values.parentCache.ca }}
{{- toYaml $config }}
{{- end }}

{{/* The parent cache's StatefulSet, headless Service and ConfigMap. */}}
{{- define "burstbuffer.parent.fullname" -}}
{{- printf "%s-parent" (include "burstbuffer.fullname" . | trunc 50 | trimSuffix "-") }}
{{- end }}

{{/* Labels on the parent cache's objects. */}}
{{- define "burstbuffer.parent.labels" -}}
helm.sh/chart: {{ include "burstbuffer.chart" . }}
{{ include "burstbuffer.parent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the parent cache's pods. */}}
{{- define "burstbuffer.parent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "burstbuffer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: parent-cache
{{- end }}

{{/*
The sidecars' --parent URLs (JSON list): one per replica of the chart's Squid, by its
stable StatefulSet name (an address would change whenever the pod is rescheduled and
move its share of the objects), or parentCache.url, or none.
*/}}
{{- define "burstbuffer.parent.urls" -}}
{{- $urls := list }}
{{- if .Values.parentCache.enabled }}
{{- $service := include "burstbuffer.parent.fullname" . }}
{{- $scheme := ternary "https" "http" .Values.parentCache.tls.enabled }}
{{- $port := ternary .Values.parentCache.tls.port .Values.parentCache.httpPort .Values.parentCache.tls.enabled }}
{{- range $i := until (int .Values.parentCache.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:%v" $scheme $service $i $service $.Release.Namespace $port) }}
{{- end }}
{{- else if .Values.parentCache.url }}
{{- range splitList "," .Values.parentCache.url }}
{{- $urls = append $urls (trim .) }}
{{- end }}
{{- end }}
{{- toJson $urls }}
{{- end }}

{{/* The Squid containers' security context (the image runs as UID/GID 13). */}}
{{- define "burstbuffer.parent.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* The Squid containers' mounts: config, cache, run directory, TLS, origin CAs. */}}
{{- define "burstbuffer.parent.volumeMounts" -}}
- name: config
  mountPath: /etc/squid/conf
  readOnly: true
- name: cache
  mountPath: /var/spool/squid
- name: run
  mountPath: /run/squid
{{- if .Values.parentCache.tls.enabled }}
- name: tls
  mountPath: /etc/squid/tls
  readOnly: true
{{- end }}
{{- if .Values.sidecar.upstreamCA.configMapName }}
- name: upstream-ca
  mountPath: /etc/squid/upstream-ca
  readOnly: true
{{- end }}
{{- end }}
