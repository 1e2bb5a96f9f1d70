{{/* Names and labels. */}}
{{- define "lastcall-spoa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lastcall-spoa.fullname" -}}
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

{{- define "lastcall-spoa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lastcall-spoa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pods' labels (and every object's): the selector's, then version, part-of,
commonLabels. podLabels are added on the pods only. */}}
{{- define "lastcall-spoa.podLabels" -}}
{{ include "lastcall-spoa.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: lastcall
app.kubernetes.io/component: {{ .Values.mode }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of every object: the pods' (above) and the chart's and Helm's. */}}
{{- define "lastcall-spoa.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "lastcall-spoa.podLabels" . }}
{{- end }}

{{/* repository:tag, or repository:tag@digest when image.digest pins it. */}}
{{- define "lastcall-spoa.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* The workload's kind: a DaemonSet only for standalone agents that ask for one. */}}
{{- define "lastcall-spoa.kind" -}}
{{- if and (eq .Values.mode "standalone") .Values.daemonSet.enabled }}DaemonSet{{ else }}Deployment{{ end }}
{{- end }}

{{/* Where the agent reads the CRS of crs.image / crs.volume. */}}
{{- define "lastcall-spoa.crsMount" -}}/opt/lastcall-spoa/crs{{- end }}

{{/* Whether a CRS tree is given (crs.image or crs.volume). */}}
{{- define "lastcall-spoa.crsGiven" -}}
{{- if or .Values.crs.image.repository .Values.crs.volume }}true{{ end }}
{{- end }}

{{/* The CRS copier: copies crs.path of crs.image into the emptyDir the agent reads. */}}
{{- define "lastcall-spoa.crsInit" -}}
{{- $c := .Values.crs }}
name: crs
image: {{ printf "%s:%s" $c.image.repository (default "latest" $c.image.tag) }}
imagePullPolicy: {{ $c.image.pullPolicy }}
command:
{{- if $c.command }}
{{- toYaml $c.command | nindent 2 }}
{{- else }}
  - cp
  - -R
  - {{ printf "%s/." (trimSuffix "/" $c.path) }}
  - /crs-out/
{{- end }}
{{- with .Values.securityContext }}
securityContext:
{{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: crs
    mountPath: /crs-out
{{- end }}

{{/* The init containers: the user's first, then the chart's own (the CRS copier, the
native sidecar agent). */}}
{{- define "lastcall-spoa.initContainers" -}}
{{- with .Values.initContainers }}
{{ toYaml . }}
{{- end }}
{{- if .Values.crs.image.repository }}
- {{ include "lastcall-spoa.crsInit" . | trim | nindent 2 | trim }}
{{- end }}
{{- if and (eq .Values.mode "sidecar") .Values.sidecar.native }}
# Native sidecar: started before HAProxy, stopped only after HAProxy has exited.
- {{ include "lastcall-spoa.agentContainer" . | trim | nindent 2 | trim }}
  restartPolicy: Always
{{- end }}
{{- end }}

{{- define "lastcall-spoa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lastcall-spoa.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The termination budget, in whole seconds. Everything below is derived from it.
  standalone: agent drains with --shutdown-delay D --drain-timeout T.
              grace = D + T + margin
  sidecar:    HAProxy keeps listening D s after SIGUSR1 (`grace`), then soft-stops and is
              gone at the latest T s later (`hard-stop-after`); the agent gets
              agentExitSeconds (E) beyond that.
              grace = D + T + E + margin
  off:        --on-sigterm exit, grace = disabledGracePeriodSeconds.
*/}}
{{- define "lastcall-spoa.delay" -}}
{{- int .Values.gracefulTermination.shutdownDelaySeconds }}
{{- end }}

{{- define "lastcall-spoa.timeout" -}}
{{- int .Values.gracefulTermination.drainTimeoutSeconds }}
{{- end }}

{{- define "lastcall-spoa.graceSeconds" -}}
{{- $g := .Values.gracefulTermination }}
{{- if not $g.enabled }}
{{- int $g.disabledGracePeriodSeconds }}
{{- else }}
{{- $d := int $g.shutdownDelaySeconds }}
{{- $t := int $g.drainTimeoutSeconds }}
{{- if ge $d $t }}
{{- fail (printf "gracefulTermination.shutdownDelaySeconds (%d) must be shorter than gracefulTermination.drainTimeoutSeconds (%d): the drain deadline counts from SIGTERM (the daemon refuses to start otherwise)" $d $t) }}
{{- end }}
{{- $derived := add $d $t (int $g.marginSeconds) }}
{{- if eq .Values.mode "sidecar" }}
{{- $derived = add $derived (int .Values.sidecar.agentExitSeconds) }}
{{- end }}
{{- if kindIs "invalid" $g.terminationGracePeriodSeconds }}
{{- $derived }}
{{- else if lt (int $g.terminationGracePeriodSeconds) (int $derived) }}
{{- fail (printf "gracefulTermination.terminationGracePeriodSeconds (%d) is shorter than the drain needs (%d = shutdownDelaySeconds + drainTimeoutSeconds + margin): it would cut the drain short" (int $g.terminationGracePeriodSeconds) (int $derived)) }}
{{- else }}
{{- int $g.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}
{{- end }}

{{/* The --on-sigterm policy for the agent. */}}
{{- define "lastcall-spoa.onSigterm" -}}
{{- $g := .Values.gracefulTermination }}
{{- if not $g.enabled }}exit
{{- else if $g.onSigterm }}{{ $g.onSigterm }}
{{- else if and (eq .Values.mode "sidecar") (not .Values.sidecar.native) }}linger
{{- else }}drain
{{- end }}
{{- end }}

{{/* The agent's command-line arguments (termination, admin, logging). */}}
{{- define "lastcall-spoa.agentArgs" -}}
{{- $g := .Values.gracefulTermination }}
{{- $d := int $g.shutdownDelaySeconds }}
{{- $t := int $g.drainTimeoutSeconds }}
{{- $e := int .Values.sidecar.agentExitSeconds }}
- --config=/etc/lastcall-spoa/config.yaml
{{- if .Values.agent.autoreload }}
- --autoreload
{{- end }}
- --on-sigterm={{ include "lastcall-spoa.onSigterm" . }}
{{- if $g.enabled }}
{{- if eq .Values.mode "standalone" }}
- --shutdown-delay={{ $d }}s
- --drain-timeout={{ $t }}s
{{- else if .Values.sidecar.native }}
{{- /* Stopped only after HAProxy has exited: nobody is left to announce anything to. */}}
- --shutdown-delay=0s
- --drain-timeout={{ $e }}s
{{- else }}
{{- /* Classic container: stopped together with HAProxy; serve it until it is gone. */}}
- --shutdown-delay={{ $d }}s
- --drain-timeout={{ add $d $t $e }}s
{{- end }}
- --drain-min-sessions={{ int $g.drainMinSessions }}
{{- end }}
- --admin-addr={{ .Values.admin.address }}:{{ int .Values.admin.port }}
{{- if .Values.admin.tokenSecret.name }}
- --admin-token-file=/etc/lastcall-spoa-admin/{{ .Values.admin.tokenSecret.key }}
{{- end }}
{{- if .Values.crs.image.repository }}
- --crs-dir={{ include "lastcall-spoa.crsMount" . }}
{{- else if .Values.crs.volume }}
- --crs-dir={{ include "lastcall-spoa.crsMount" . }}
{{- end }}
- --log-format={{ .Values.agent.logFormat }}
- --log-level={{ .Values.agent.logLevel }}
{{- range .Values.agent.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Where a container of the pod reaches the agent's admin listener. */}}
{{- define "lastcall-spoa.adminLoopback" -}}
{{- if has .Values.admin.address (list "0.0.0.0" "127.0.0.1") }}127.0.0.1
{{- else }}{{ .Values.admin.address }}
{{- end }}
{{- end }}

{{/* Probes on the admin listener. */}}
{{- define "lastcall-spoa.agentProbes" -}}
{{- $p := .Values.probes }}
startupProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: {{ int $p.startup.periodSeconds }}
  timeoutSeconds: {{ int $p.startup.timeoutSeconds }}
  failureThreshold: {{ int $p.startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /livez
    port: admin
  periodSeconds: {{ int $p.liveness.periodSeconds }}
  timeoutSeconds: {{ int $p.liveness.timeoutSeconds }}
  failureThreshold: {{ int $p.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: {{ int $p.readiness.periodSeconds }}
  timeoutSeconds: {{ int $p.readiness.timeoutSeconds }}
  failureThreshold: {{ int $p.readiness.failureThreshold }}
  successThreshold: {{ int $p.readiness.successThreshold }}
{{- end }}

{{/* The agent container (without the restartPolicy a native sidecar adds). */}}
{{- define "lastcall-spoa.agentContainer" -}}
name: agent
image: {{ include "lastcall-spoa.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
{{- include "lastcall-spoa.agentArgs" . | trim | nindent 2 }}
{{- $env := concat (default (list) .Values.agent.env) (default (list) .Values.extraEnv) }}
{{- with $env }}
env:
{{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: spop
    containerPort: {{ int .Values.agent.port }}
    protocol: TCP
  - name: admin
    containerPort: {{ int .Values.admin.port }}
    protocol: TCP
{{- include "lastcall-spoa.agentProbes" . | trim | nindent 0 }}
{{- with (mustMergeOverwrite (deepCopy (.Values.resources | default dict)) (.Values.agent.resources | default dict)) }}
resources:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.securityContext }}
securityContext:
{{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: agent-config
    mountPath: /etc/lastcall-spoa
    readOnly: true
  - name: tmp
    mountPath: /tmp
{{- if .Values.admin.tokenSecret.name }}
  - name: admin-token
    mountPath: /etc/lastcall-spoa-admin
    readOnly: true
{{- end }}
{{- if .Values.crs.image.repository }}
  - name: crs
    mountPath: {{ include "lastcall-spoa.crsMount" . }}
    readOnly: true
{{- else if .Values.crs.volume }}
  - name: crs
    mountPath: {{ include "lastcall-spoa.crsMount" . }}
    readOnly: true
    {{- $sub := trimPrefix "/" .Values.crs.path }}
    {{- if $sub }}
    subPath: {{ $sub }}
    {{- end }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "lastcall-spoa.agentVolumes" -}}
- name: agent-config
  configMap:
    name: {{ default (printf "%s-agent" (include "lastcall-spoa.fullname" .)) .Values.agent.existingConfigMap }}
    items:
      - key: config.yaml
        path: config.yaml
- name: tmp
  emptyDir: {}
{{- if .Values.admin.tokenSecret.name }}
- name: admin-token
  secret:
    secretName: {{ .Values.admin.tokenSecret.name }}
{{- end }}
{{- if .Values.crs.image.repository }}
- name: crs
  emptyDir: {}
{{- else if .Values.crs.volume }}
- name: crs
{{- toYaml .Values.crs.volume | nindent 2 }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "lastcall-spoa.podAnnotations" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ int .Values.admin.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "lastcall-spoa.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "lastcall-spoa.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
terminationGracePeriodSeconds: {{ include "lastcall-spoa.graceSeconds" . }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
