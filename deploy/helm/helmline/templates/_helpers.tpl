{{/* The release's full name, cut to what Kubernetes names allow. */}}
{{- define "helmline.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "helmline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one service; call with (dict "root" $ "service" $name). */}}
{{- define "helmline.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end -}}

{{- define "helmline.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "helmline.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "helmline.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "helmline.natsSecret" -}}
{{- default (printf "%s-nats-users" (include "helmline.fullname" .)) .Values.nats.auth.existingSecret -}}
{{- end -}}

{{- define "helmline.postgresSecret" -}}
{{- default (printf "%s-postgres" (include "helmline.fullname" .)) .Values.postgres.existingSecret -}}
{{- end -}}

{{/* NATS_URL with this user's credentials, built from the secret's password at start. */}}
{{- define "helmline.natsEnv" -}}
{{- $nats := .root.Values.nats -}}
{{- if $nats.auth.enabled }}
- name: HELMLINE_NATS_USER
  value: {{ .user | quote }}
- name: HELMLINE_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "helmline.natsSecret" .root }}
      key: {{ .user }}
- name: HELMLINE_NATS_URL
  value: {{ include "helmline.natsUrlWithUser" (dict "url" $nats.url) | quote }}
{{- else }}
- name: HELMLINE_NATS_URL
  value: {{ $nats.url | quote }}
{{- end }}
{{- end -}}

{{/* Each server of the URL list with $(HELMLINE_NATS_USER):$(HELMLINE_NATS_PASSWORD)@ in
front, which Kubernetes expands from the variables defined before it. */}}
{{- define "helmline.natsUrlWithUser" -}}
{{- $servers := list -}}
{{- range (splitList "," .url) -}}
{{- $server := trim . -}}
{{- $scheme := "nats" -}}
{{- $address := $server -}}
{{- if contains "://" $server -}}
{{- $parts := splitList "://" $server -}}
{{- $scheme = first $parts -}}
{{- $address = last $parts -}}
{{- end -}}
{{- $servers = append $servers (printf "%s://$(HELMLINE_NATS_USER):$(HELMLINE_NATS_PASSWORD)@%s" $scheme $address) -}}
{{- end -}}
{{- join "," $servers -}}
{{- end -}}
