{{/* Names and labels. */}}
{{- /* <release>-llmq, or the release's own name when it says llmq already (release llmq: llmq-api, not llmq-llmq-api) */ -}}
{{- define "llmq.fullname" -}}
{{- $name := ternary .Release.Name (printf "%s-llmq" .Release.Name) (contains .Chart.Name .Release.Name) -}}
{{- $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "llmq.labels" -}}
app.kubernetes.io/name: llmq
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "llmq.metaLabels" -}}
{{ include "llmq.labels" . }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ .root.Chart.Name }}-{{ .root.Chart.Version }}
{{- end -}}

{{/* The settings ConfigMap's data: .Values.settings plus the connection settings. One source for the services'
ConfigMap and the topics hook's inline env (the hook runs before the ConfigMap exists). */}}
{{- define "llmq.settings" -}}
{{- $v := .Values -}}
{{- $s := deepCopy $v.settings -}}
{{- $_ := set $s "LLMQ_KAFKA_BOOTSTRAP_SERVERS" $v.kafka.bootstrapServers -}}
{{- $_ := set $s "LLMQ_KAFKA_SECURITY_PROTOCOL" $v.kafka.securityProtocol -}}
{{- $_ := set $s "LLMQ_KAFKA_SASL_MECHANISM" $v.kafka.saslMechanism -}}
{{- $_ := set $s "LLMQ_KAFKA_TOPIC_REPLICATION_FACTOR" (toString $v.kafka.topicReplicationFactor) -}}
{{- if $v.kafka.caSecret }}{{ $_ := set $s "LLMQ_KAFKA_SSL_CAFILE" "/etc/llmq/kafka-ca/ca.crt" }}{{ end -}}
{{- $_ := set $s "LLMQ_REDIS_URL" $v.redis.url -}}
{{- if $v.redis.caSecret }}{{ $_ := set $s "LLMQ_REDIS_SSL_CAFILE" "/etc/llmq/redis-ca/ca.crt" }}{{ end -}}
{{- if $v.apiKeysSecret }}{{ $_ := set $s "LLMQ_API_KEYS_FILE" "/etc/llmq/api-keys/api-keys.yaml" }}{{ end -}}
{{- $_ := set $s "LLMQ_FILES_URL" ($v.files.url | default "/data/files") -}}
{{- $_ := set $s "LLMQ_METRICS_PORT" (toString $v.metricsPort) -}}
{{- $_ := set $s "LLMQ_METRICS_HOST" "0.0.0.0" -}}
{{- if and $v.mirrorMaker.enabled $v.mirrorMaker.sources (not (hasKey $s "LLMQ_REGION_PEERS")) -}}
{{- $peers := list -}}
{{- range $v.mirrorMaker.sources }}{{ $peers = append $peers .region }}{{ end -}}
{{- $_ := set $s "LLMQ_REGION_PEERS" (join "," $peers) -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/* A role's credentials: env naming its Kafka principal / Redis user and their mounted password files. */}}
{{- define "llmq.roleEnv" -}}
{{- $v := .root.Values -}}
{{- if $v.kafka.credentialsSecret }}
- name: LLMQ_KAFKA_SASL_USERNAME
  value: {{ .role }}
- name: LLMQ_KAFKA_SASL_PASSWORD_FILE
  value: /etc/llmq/kafka-credentials/password
{{- end }}
{{- if and $v.redis.credentialsSecret (ne .role "admin") }}
- name: LLMQ_REDIS_USERNAME
  value: {{ .role }}
- name: LLMQ_REDIS_PASSWORD_FILE
  value: /etc/llmq/redis-credentials/password
{{- end }}
{{- end -}}

{{/* Volumes of a role's container: its own password keys, the CAs, /tmp (the root filesystem is read-only). */}}
{{- define "llmq.roleVolumes" -}}
{{- $v := .root.Values -}}
- name: tmp
  emptyDir: {}
{{- if $v.kafka.credentialsSecret }}
- name: kafka-credentials
  secret:
    secretName: {{ $v.kafka.credentialsSecret }}
    items: [{key: {{ .role }}, path: password}]
{{- end }}
{{- if and $v.redis.credentialsSecret (ne .role "admin") }}
- name: redis-credentials
  secret:
    secretName: {{ $v.redis.credentialsSecret }}
    items: [{key: {{ .role }}, path: password}]
{{- end }}
{{- if $v.kafka.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $v.kafka.caSecret }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- if and $v.redis.caSecret (ne .role "admin") }}
- name: redis-ca
  secret:
    secretName: {{ $v.redis.caSecret }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- end -}}

{{- define "llmq.roleMounts" -}}
{{- $v := .root.Values -}}
- name: tmp
  mountPath: /tmp
{{- if $v.kafka.credentialsSecret }}
- name: kafka-credentials
  mountPath: /etc/llmq/kafka-credentials
  readOnly: true
{{- end }}
{{- if and $v.redis.credentialsSecret (ne .role "admin") }}
- name: redis-credentials
  mountPath: /etc/llmq/redis-credentials
  readOnly: true
{{- end }}
{{- if $v.kafka.caSecret }}
- name: kafka-ca
  mountPath: /etc/llmq/kafka-ca
  readOnly: true
{{- end }}
{{- if and $v.redis.caSecret (ne .role "admin") }}
- name: redis-ca
  mountPath: /etc/llmq/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod-level pieces every llmq pod shares. */}}
{{- define "llmq.podSpecCommon" -}}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  fsGroup: {{ .Values.securityContext.runAsGroup }}
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "llmq.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | quote }}
prometheus.io/path: /metrics
checksum/settings: {{ include "llmq.settings" . | sha256sum }}
{{- end -}}

{{/* Probes of the services without an HTTP API: their metrics server answers while the process runs. */}}
{{- define "llmq.metricsProbes" -}}
readinessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 10
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 20
  failureThreshold: 3
{{- end -}}

{{/* terminationGracePeriodSeconds: preStop's sleep + the drain bound (seconds, rounded up) + the margin. */}}
{{- define "llmq.terminationGrace" -}}
{{- add (int .preStopS) (int (ceil (float64 .graceS))) (int .root.Values.terminationMarginS) -}}
{{- end -}}

{{/* Partition checks (docs/operations/kubernetes.md): rendering fails unless every model's worker partitions,
offset .. offset + maxReplicas - 1, fit in llmq.batches and no two models' ranges overlap. */}}
{{- define "llmq.checkPartitions" -}}
{{- $partitions := int (index .Values.settings "LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS") -}}
{{- $models := .Values.workers.models -}}
{{- $total := 0 -}}
{{- range $models }}{{ $total = add $total (int .maxReplicas) }}{{ end -}}
{{- if gt $total $partitions -}}
{{- fail (printf "workers: the models' maxReplicas add up to %d, more than LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS=%d partitions of llmq.batches (one per worker): raise the partitions (docs/operations/kubernetes.md \"Growing partitions\") or lower maxReplicas" $total $partitions) -}}
{{- end -}}
{{- range $i, $a := $models -}}
{{- if or (lt (int $a.maxReplicas) 1) (lt (int $a.partitionOffset) 0) (gt (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- fail (printf "workers model %s: need partitionOffset >= 0 and 0 <= minReplicas <= maxReplicas, maxReplicas >= 1" $a.name) -}}
{{- end -}}
{{- $aEnd := add $a.partitionOffset $a.maxReplicas -}}
{{- if gt (int $aEnd) $partitions -}}
{{- fail (printf "workers model %s: partitions %d..%d pass the end of llmq.batches (LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS=%d)" $a.name (int $a.partitionOffset) (sub $aEnd 1) $partitions) -}}
{{- end -}}
{{- range $j, $b := $models -}}
{{- $bEnd := add $b.partitionOffset $b.maxReplicas -}}
{{- if and (lt $i $j) (lt (int $a.partitionOffset) (int $bEnd)) (lt (int $b.partitionOffset) (int $aEnd)) -}}
{{- fail (printf "workers models %s and %s: partition ranges %d..%d and %d..%d overlap (one worker per partition)" $a.name $b.name (int $a.partitionOffset) (sub $aEnd 1) (int $b.partitionOffset) (sub $bEnd 1)) -}}
{{- end -}}
{{- if and (lt $i $j) (eq $a.name $b.name) -}}
{{- fail (printf "workers: two models are named %s" $a.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The batch-job file store: a ReadWriteMany claim at /data/files, unless files.url names an object store. */}}
{{- define "llmq.filesMount" -}}
{{- if not .Values.files.url }}
- {name: files, mountPath: /data/files}
{{- end }}
{{- end -}}

{{- define "llmq.filesVolume" -}}
{{- if not .Values.files.url }}
- name: files
  persistentVolumeClaim:
    claimName: {{ .Values.files.persistentVolumeClaim }}
{{- end }}
{{- end -}}

{{- define "llmq.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  labels: {{- include "llmq.metaLabels" (dict "root" .root "component" .component) | nindent 4 }}
spec:
  {{- toYaml .budget | nindent 2 }}
  selector:
    matchLabels:
      {{- include "llmq.labels" (dict "root" .root "component" .component) | nindent 6 }}
      {{- with .model }}
      llmq.io/worker: {{ . }}
      {{- end }}
{{- end -}}

{{/* Batcher and result-router: one Deployment each, probed on their metrics port, drained by SIGTERM. */}}
{{- define "llmq.service" -}}
{{- $v := .root.Values -}}
{{- $name := printf "%s-%s" (include "llmq.fullname" .root) .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels: {{- include "llmq.metaLabels" . | nindent 4 }}
spec:
  {{- if not $v.autoscaling.enabled }}
  replicas: {{ .values.replicas }}
  {{- end }}
  selector:
    matchLabels: {{- include "llmq.labels" . | nindent 6 }}
  template:
    metadata:
      labels: {{- include "llmq.labels" . | nindent 8 }}
      annotations: {{- include "llmq.scrapeAnnotations" .root | nindent 8 }}
    spec:
      {{- include "llmq.podSpecCommon" .root | nindent 6 }}
      # SIGTERM drains within LLMQ_SHUTDOWN_GRACE_S (hands back uncommitted work); no preStop: no traffic comes in
      terminationGracePeriodSeconds: {{ include "llmq.terminationGrace" (dict "root" .root "preStopS" 0 "graceS" (index $v.settings "LLMQ_SHUTDOWN_GRACE_S")) }}
      containers:
        - name: {{ .component }}
          image: "{{ $v.image.repository }}:{{ $v.image.tag }}"
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: [python, -m, {{ .module }}, --instance-id, $(LLMQ_API_INSTANCE_ID)]
          envFrom:
            - configMapRef:
                name: {{ include "llmq.fullname" .root }}-settings
          env:
            - name: LLMQ_API_INSTANCE_ID
              valueFrom:
                fieldRef: {fieldPath: metadata.name}
            {{- include "llmq.roleEnv" . | trim | nindent 12 }}
          ports:
            - {name: metrics, containerPort: {{ $v.metricsPort }}}
          {{- include "llmq.metricsProbes" . | nindent 10 }}
          resources: {{- toYaml .values.resources | nindent 12 }}
          securityContext: {{- toYaml $v.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "llmq.roleMounts" . | trim | nindent 12 }}
            {{- if .files }}{{ include "llmq.filesMount" .root | trim | nindent 12 }}{{ end }}
            {{- if $v.apiKeysSecret }}
            - {name: api-keys, mountPath: /etc/llmq/api-keys, readOnly: true}
            {{- end }}
      volumes:
        {{- include "llmq.roleVolumes" . | trim | nindent 8 }}
        {{- if .files }}{{ include "llmq.filesVolume" .root | trim | nindent 8 }}{{ end }}
        {{- if $v.apiKeysSecret }}
        - name: api-keys
          secret:
            secretName: {{ $v.apiKeysSecret }}
            items: [{key: api-keys.yaml, path: api-keys.yaml}]
        {{- end }}
---
{{ include "llmq.pdb" (dict "root" .root "component" .component "name" $name "budget" .values.podDisruptionBudget) }}
{{- if $v.autoscaling.enabled }}
{{- $a := .scaling }}
{{- $partitions := int (index $v.settings .partitionsSetting) }}
{{- if gt (int .values.replicas) $partitions }}
{{- fail (printf "%s: replicas %d exceed %s=%d (a consumer group member beyond one per partition idles)" .component (int .values.replicas) .partitionsSetting $partitions) }}
{{- end }}
{{- $sel := $v.autoscaling.prometheus.labelSelector }}
---
# docs/operations/observability.md "Autoscaling": consumer lag per replica above the row's threshold for its window; at most one per partition.
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  labels: {{- include "llmq.metaLabels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicaCount: {{ .values.replicas }}
  maxReplicaCount: {{ $partitions }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: {{ $a.scaleInWindowS }}
  triggers:
    - type: prometheus
      name: consumer-lag
      metricType: AverageValue
      metadata:
        serverAddress: {{ $v.autoscaling.prometheus.serverAddress }}
        query: min_over_time(sum(llmq_kafka_consumer_lag{group="{{ .group }}"{{ with $sel }},{{ . }}{{ end }}})[{{ $a.windowMin }}m:15s])
        threshold: {{ $a.consumerLag | quote }}
{{- end }}
{{- end -}}
