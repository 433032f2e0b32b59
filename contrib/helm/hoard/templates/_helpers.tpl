{{/* The name of every object: the release's, as "hoard" in the usual install. */}}
{{- define "hoard.name" -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- end -}}

{{- define "hoard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "hoard.secretName" -}}
{{- .Values.origin.existingSecret | default (include "hoard.name" .) -}}
{{- end -}}

{{/* The image's unprivileged user, a read-only root, nothing more. */}}
{{- define "hoard.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hoard.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Liveness on /healthz, readiness on /readyz, on the port named http. */}}
{{- define "hoard.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}
