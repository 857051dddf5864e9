{{/* Chart name. */}}
{{- define "scorer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "scorer.fullname" -}}
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

{{- define "scorer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "scorer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scorer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "scorer.labels" -}}
helm.sh/chart: {{ include "scorer.chart" . }}
{{ include "scorer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: scorer
{{- end }}

{{- define "scorer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "scorer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Container image: the CUDA image when gpu.enabled. */}}
{{- define "scorer.image" -}}
{{- $repo := .Values.image.repository }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.gpu.enabled }}
{{- $repo = default .Values.image.repository .Values.gpu.image.repository }}
{{- $tag = default $tag .Values.gpu.image.tag }}
{{- end }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Name of the Secret the pod reads with envFrom ("" = none). */}}
{{- define "scorer.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if or .Values.secret.env .Values.kafka.sasl.password }}
{{- include "scorer.fullname" . }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: shutdownTimeoutSeconds + terminationMarginSeconds, or the explicit value,
which must not be smaller than that sum (the kubelet's SIGKILL would cut the drain and commit short).
*/}}
{{- define "scorer.terminationGracePeriodSeconds" -}}
{{- $shutdown := int .Values.shutdownTimeoutSeconds }}
{{- $margin := int .Values.terminationMarginSeconds }}
{{- if le $shutdown 0 }}
{{- fail "shutdownTimeoutSeconds must be > 0" }}
{{- end }}
{{- if lt $margin 5 }}
{{- fail "terminationMarginSeconds must be >= 5" }}
{{- end }}
{{- $min := add $shutdown $margin }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $min }}
{{- else }}
{{- $explicit := int .Values.terminationGracePeriodSeconds }}
{{- if lt $explicit (int $min) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be >= shutdownTimeoutSeconds (%d) + terminationMarginSeconds (%d) = %d" $explicit $shutdown $margin (int $min)) }}
{{- end }}
{{- $explicit }}
{{- end }}
{{- end }}

{{/*
"true" when the Deployment sets GOMAXPROCS from requests.cpu: goMaxProcsFromCPURequest is on, a CPU
request is set, and the user has not set GOMAXPROCS in extraEnv or config.
*/}}
{{- define "scorer.setGOMAXPROCS" -}}
{{- $explicit := hasKey (default dict .Values.config) "GOMAXPROCS" }}
{{- range .Values.extraEnv }}
{{- if eq (toString .name) "GOMAXPROCS" }}
{{- $explicit = true }}
{{- end }}
{{- end }}
{{- $cpu := dig "requests" "cpu" "" (default dict .Values.resources) }}
{{- if and .Values.goMaxProcsFromCPURequest $cpu (not $explicit) -}}
true
{{- end }}
{{- end }}

{{/* Checks that do not belong to one template. */}}
{{- define "scorer.validate" -}}
{{- /* Keys the ConfigMap or the Secret sets from other values, with where each comes from. A key here may
not be repeated in config (it would render twice, and which one wins would depend on the order); values.yaml's
comment above config lists the same keys, and deploy's tests keep the two and the ConfigMap in step. */ -}}
{{- $reserved := dict
  "KAFKA_BROKERS" "kafka.brokers"
  "KAFKA_INPUT_TOPIC" "kafka.inputTopic"
  "KAFKA_OUTPUT_TOPIC" "kafka.outputTopic"
  "KAFKA_DLQ_TOPIC" "kafka.dlqTopic"
  "OUTPUT_ROWS_TOPIC" "kafka.rowsTopic"
  "KAFKA_GROUP_ID" "kafka.groupId"
  "KAFKA_CLIENT_ID" "kafka.clientId"
  "KAFKA_INPUT_PARTITIONS" "kafka.inputPartitions"
  "KAFKA_TOPIC_REPLICATION_FACTOR" "kafka.topicReplicationFactor"
  "KAFKA_SASL_MECHANISM" "kafka.sasl.mechanism"
  "KAFKA_SASL_USERNAME" "kafka.sasl.username"
  "KAFKA_SASL_PASSWORD" "kafka.sasl.password or secret.*"
  "KAFKA_SASL_PASSWORD_FILE" "kafka.sasl.password or secret.*"
  "KAFKA_TLS" "kafka.tls.enabled"
  "KAFKA_TLS_INSECURE_SKIP_VERIFY" "kafka.tls.insecureSkipVerify"
  "KAFKA_TLS_CA_FILE" "kafka.tls.secretName and caKey"
  "KAFKA_TLS_CERT_FILE" "kafka.tls.secretName and certKey"
  "KAFKA_TLS_KEY_FILE" "kafka.tls.secretName and keyKey"
  "MODEL_DIR" "model.dir"
  "METRICS_ADDR" "metrics.port"
  "SHUTDOWN_TIMEOUT" "shutdownTimeoutSeconds" }}
{{- range $k, $v := .Values.config }}
{{- if hasKey $reserved $k }}
{{- fail (printf "config.%s is set from other values (%s); remove it from config" $k (get $reserved $k)) }}
{{- end }}
{{- end }}
{{- if not (has .Values.model.source (list "pvc" "hostPath" "image")) }}
{{- fail (printf "model.source must be pvc, hostPath or image, not %q" .Values.model.source) }}
{{- end }}
{{- if not (trim (replace "," "" .Values.kafka.brokers)) }}
{{- fail "kafka.brokers is required (the scorer refuses an empty KAFKA_BROKERS)" }}
{{- end }}
{{- if has "embedded" (splitList "," (lower (nospace .Values.kafka.brokers))) }}
{{- fail "kafka.brokers may not be embedded: that starts an in-memory demo broker inside each pod, not durable and seen by nothing else" }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if and (or .certKey .keyKey) (not (and .certKey .keyKey)) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together" }}
{{- end }}
{{- if and (or .certKey .keyKey) (not .secretName) }}
{{- fail "kafka.tls.certKey/keyKey need kafka.tls.secretName" }}
{{- end }}
{{- end }}
{{- if and .Values.kafka.sasl.mechanism (not (has .Values.kafka.sasl.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512"))) }}
{{- fail (printf "kafka.sasl.mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, not %q" .Values.kafka.sasl.mechanism) }}
{{- end }}
{{- if lt (int .Values.kafka.inputPartitions) 1 }}
{{- fail "kafka.inputPartitions must be >= 1" }}
{{- end }}
{{- end }}
