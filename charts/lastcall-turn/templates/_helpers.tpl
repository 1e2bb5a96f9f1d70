{{/* Names and labels. */}}
{{- define "lastcall-turn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lastcall-turn.fullname" -}}
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

{{- define "lastcall-turn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lastcall-turn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pods' labels (and every object's): the selector's, then version, part-of,
commonLabels. podLabels are added on the pods only. */}}
{{- define "lastcall-turn.podLabels" -}}
{{ include "lastcall-turn.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: lastcall
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of every object: the pods' (above) and the chart's and Helm's. */}}
{{- define "lastcall-turn.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "lastcall-turn.podLabels" . }}
{{- end }}

{{/* repository:tag, or repository:tag@digest when image.digest pins it. */}}
{{- define "lastcall-turn.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{- define "lastcall-turn.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lastcall-turn.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lastcall-turn.authSecretName" -}}
{{- default (printf "%s-auth" (include "lastcall-turn.fullname" .)) .Values.turn.auth.existingSecret }}
{{- end }}

{{/*
terminationGracePeriodSeconds = shutdownDelaySeconds + drainTimeoutSeconds + marginSeconds,
or an override that is not shorter; disabledGracePeriodSeconds when graceful termination
is off.
*/}}
{{- define "lastcall-turn.graceSeconds" -}}
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
{{- if kindIs "invalid" $g.terminationGracePeriodSeconds }}
{{- $derived }}
{{- else if lt (int $g.terminationGracePeriodSeconds) (int $derived) }}
{{- fail (printf "gracefulTermination.terminationGracePeriodSeconds (%d) is shorter than the drain needs (%d = shutdownDelaySeconds + drainTimeoutSeconds + marginSeconds): it would cut calls short" (int $g.terminationGracePeriodSeconds) (int $derived)) }}
{{- else }}
{{- int $g.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when a port the container binds is below 1024 (a listener, the admin port, the
first relay port): it then gets NET_BIND_SERVICE. */}}
{{- define "lastcall-turn.privilegedPort" -}}
{{- $t := .Values.turn }}
{{- if or (lt (int $t.listeningPort) 1024) (and .Values.tls.enabled (lt (int $t.tlsListeningPort) 1024)) (lt (int .Values.admin.port) 1024) (lt (int $t.minPort) 1024) }}true{{ end }}
{{- end }}

{{/* Where the daemon reads its node's external-ip: the map's file, the lookup's, or none. */}}
{{- define "lastcall-turn.externalIPFile" -}}
{{- $t := .Values.turn }}
{{- if and $t.externalIPs $t.externalIPFromNode.enabled }}
{{- fail "turn.externalIPs and turn.externalIPFromNode.enabled: give one (the map, or the node's address from the Kubernetes API)" }}
{{- end }}
{{- if $t.externalIPFromNode.enabled }}/run/lastcall-turn/node/external-ip
{{- else if $t.externalIPs }}/etc/lastcall-turn/external-ips/$(NODE_NAME)
{{- end }}
{{- end }}

{{- define "lastcall-turn.args" -}}
{{- $g := .Values.gracefulTermination }}
- -c
- /etc/lastcall-turn/config/turnserver.conf
{{- if not .Values.config.existingSecret }}
- --listening-ip={{ default "$(POD_IP)" .Values.turn.listeningIP }}
- --relay-ip={{ default "$(POD_IP)" .Values.turn.relayIP }}
{{- with include "lastcall-turn.externalIPFile" . }}
- --external-ip-file={{ . }}
{{- end }}
{{- if .Values.turn.auth.useAuthSecret }}
- --static-auth-secret=$(TURN_STATIC_AUTH_SECRET)
{{- range $i, $k := .Values.turn.auth.extraKeys }}
- --static-auth-secret=$(TURN_STATIC_AUTH_SECRET_{{ $i }})
{{- end }}
{{- end }}
{{- end }}
{{- if $g.enabled }}
- --on-sigterm={{ default "drain" $g.onSigterm }}
- --shutdown-delay={{ int $g.shutdownDelaySeconds }}s
- --drain-timeout={{ int $g.drainTimeoutSeconds }}s
- --drain-min-sessions={{ int $g.drainMinAllocations }}
{{- else }}
- --on-sigterm=exit
{{- end }}
- --admin-addr={{ .Values.admin.address }}:{{ int .Values.admin.port }}
{{- if .Values.admin.tokenSecret.name }}
- --admin-token-file=/etc/lastcall-turn/admin/{{ .Values.admin.tokenSecret.key }}
{{- end }}
- --log-format={{ .Values.logFormat }}
- --log-level={{ .Values.logLevel }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The pod template shared by the DaemonSet and the StatefulSet. */}}
{{- define "lastcall-turn.podTemplate" -}}
{{- $fullname := include "lastcall-turn.fullname" . }}
metadata:
  labels:
    {{- include "lastcall-turn.podLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # Every ConfigMap and Secret the chart renders for the pod: a change rolls the pods
    # (tests/charts/test_checksums.py). What is given by name (tls.existingSecret,
    # config.existingSecret, turn.auth.existingSecret) cannot be hashed here: see
    # docs/kubernetes.md, "Changes that reach the pods".
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with include (print $.Template.BasePath "/secret.yaml") . | trim }}
    checksum/secret: {{ . | sha256sum }}
    {{- end }}
    {{- if .Values.metrics.podAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ int .Values.admin.port | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  # TURN relays on the node's addresses: clients and peers reach them directly.
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- if .Values.shareProcessNamespace }}
  # For a reloader in extraContainers that signals the daemon (SIGUSR2); the daemon also
  # reloads the certificate by itself when the mounted files change.
  shareProcessNamespace: true
  {{- end }}
  terminationGracePeriodSeconds: {{ include "lastcall-turn.graceSeconds" . }}
  serviceAccountName: {{ include "lastcall-turn.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.affinity }}
  affinity:
    {{- toYaml .Values.affinity | nindent 4 }}
  {{- else if eq .Values.kind "StatefulSet" }}
  affinity:
    # One pod per node: they bind the same host ports.
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "lastcall-turn.selectorLabels" . | nindent 14 }}
  {{- end }}
  {{- if or .Values.initContainers .Values.turn.externalIPFromNode.enabled }}
  initContainers:
    {{- with .Values.initContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- if .Values.turn.externalIPFromNode.enabled }}
    {{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
    {{- fail "turn.externalIPFromNode needs a ServiceAccount allowed to get nodes: serviceAccount.create=true (the chart binds it), or serviceAccount.name" }}
    {{- end }}
    # The node's address from the Kubernetes API, for --external-ip-file (wire's chart did
    # this with kubectl). Its token is mounted here only.
    - name: node-external-ip
      image: {{ include "lastcall-turn.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - node-external-ip
        - --node=$(NODE_NAME)
        - --out=/run/lastcall-turn/node/external-ip
        - --address-type={{ .Values.turn.externalIPFromNode.addressType }}
        - --token-file=/var/run/secrets/lastcall-turn/token/token
        - --ca-file=/var/run/secrets/lastcall-turn/token/ca.crt
      env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
      volumeMounts:
        - name: node-external-ip
          mountPath: /run/lastcall-turn/node
        - name: node-token
          mountPath: /var/run/secrets/lastcall-turn/token
          readOnly: true
    {{- end }}
  {{- end }}
  containers:
    - name: turn
      image: {{ include "lastcall-turn.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        {{- include "lastcall-turn.args" . | trim | nindent 8 }}
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        {{- if and .Values.turn.auth.useAuthSecret (not .Values.config.existingSecret) }}
        - name: TURN_STATIC_AUTH_SECRET
          valueFrom:
            secretKeyRef:
              name: {{ include "lastcall-turn.authSecretName" . }}
              key: {{ .Values.turn.auth.key }}
        {{- range $i, $k := .Values.turn.auth.extraKeys }}
        - name: TURN_STATIC_AUTH_SECRET_{{ $i }}
          valueFrom:
            secretKeyRef:
              name: {{ include "lastcall-turn.authSecretName" $ }}
              key: {{ $k }}
        {{- end }}
        {{- end }}
        {{- with .Values.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        {{- if .Values.turn.udp }}
        - name: turn-udp
          containerPort: {{ int .Values.turn.listeningPort }}
          protocol: UDP
        {{- end }}
        {{- if .Values.turn.tcp }}
        - name: turn-tcp
          containerPort: {{ int .Values.turn.listeningPort }}
          protocol: TCP
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: turns-tcp
          containerPort: {{ int .Values.turn.tlsListeningPort }}
          protocol: TCP
        {{- end }}
        - name: admin
          containerPort: {{ int .Values.admin.port }}
          protocol: TCP
      startupProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: {{ int .Values.probes.startup.periodSeconds }}
        timeoutSeconds: {{ int .Values.probes.startup.timeoutSeconds }}
        failureThreshold: {{ int .Values.probes.startup.failureThreshold }}
      livenessProbe:
        httpGet:
          path: /livez
          port: admin
        periodSeconds: {{ int .Values.probes.liveness.periodSeconds }}
        timeoutSeconds: {{ int .Values.probes.liveness.timeoutSeconds }}
        failureThreshold: {{ int .Values.probes.liveness.failureThreshold }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: {{ int .Values.probes.readiness.periodSeconds }}
        timeoutSeconds: {{ int .Values.probes.readiness.timeoutSeconds }}
        failureThreshold: {{ int .Values.probes.readiness.failureThreshold }}
        successThreshold: {{ int .Values.probes.readiness.successThreshold }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if include "lastcall-turn.privilegedPort" . }}
      {{- $sc := deepCopy (default dict .Values.securityContext) }}
      {{- $caps := deepCopy (default dict $sc.capabilities) }}
      {{- $_ := set $caps "add" (append (without (default list $caps.add) "NET_BIND_SERVICE") "NET_BIND_SERVICE") }}
      {{- $_ := set $sc "capabilities" $caps }}
      # A port below 1024: NET_BIND_SERVICE, the one capability, still as the pod's non-root
      # user: the image's binary has it as a file capability (=p), raised by the daemon only
      # for a port below net.ipv4.ip_unprivileged_port_start (see values.yaml).
      securityContext:
        {{- toYaml $sc | nindent 8 }}
      {{- else }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: /etc/lastcall-turn/config
          readOnly: true
        {{- if .Values.turn.externalIPs }}
        - name: external-ips
          mountPath: /etc/lastcall-turn/external-ips
          readOnly: true
        {{- end }}
        {{- if .Values.turn.externalIPFromNode.enabled }}
        - name: node-external-ip
          mountPath: /run/lastcall-turn/node
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: tls
          mountPath: /etc/lastcall-turn/tls
          readOnly: true
        {{- end }}
        {{- if .Values.admin.tokenSecret.name }}
        - name: admin-token
          mountPath: /etc/lastcall-turn/admin
          readOnly: true
        {{- end }}
    {{- with .Values.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumes:
    - name: config
      {{- if .Values.config.existingSecret }}
      secret:
        secretName: {{ .Values.config.existingSecret }}
        items:
          - key: turnserver.conf
            path: turnserver.conf
      {{- else }}
      configMap:
        name: {{ $fullname }}
        items:
          - key: turnserver.conf
            path: turnserver.conf
      {{- end }}
    {{- if .Values.tls.enabled }}
    - name: tls
      secret:
        secretName: {{ required "tls.existingSecret is required when tls.enabled" .Values.tls.existingSecret }}
    {{- end }}
    {{- if .Values.admin.tokenSecret.name }}
    - name: admin-token
      secret:
        secretName: {{ .Values.admin.tokenSecret.name }}
    {{- end }}
    {{- if .Values.turn.externalIPs }}
    - name: external-ips
      configMap:
        name: {{ $fullname }}-external-ips
    {{- end }}
    {{- if .Values.turn.externalIPFromNode.enabled }}
    - name: node-external-ip
      emptyDir: {}
    - name: node-token
      projected:
        sources:
          - serviceAccountToken:
              path: token
              expirationSeconds: 600
          - configMap:
              name: kube-root-ca.crt
              items:
                - key: ca.crt
                  path: ca.crt
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
