#!/bin/bash
# The llmq-kafka image's start (deploy/images/kafka.Dockerfile): writes the broker's properties from the environment
# the way the apache/kafka image reads it (KAFKA_<NAME> -> <name> in lower case, with ___ -> -, __ -> _, _ -> .;
# CLUSTER_ID and the JVM's KAFKA_JVM_FLAGS / KAFKA_HEAP_OPTS / KAFKA_OPTS apart), formats the storage once with one
# SCRAM-SHA-512 credential per llmq role whose password is mounted (/run/secrets/<role>.password; credentials live
# only in the cluster metadata), then runs the broker.
# `kafka-start.sh --properties` prints the properties and stops (tests/unit/deploy/test_compose.py).
set -euo pipefail
config=${KAFKA_PROPERTIES_FILE:-/tmp/server.properties}
: >"$config"
for name in $(compgen -e); do
  case "$name" in
    KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_FLAGS | KAFKA_HEALTH_PORT | KAFKA_PROPERTIES_FILE) ;;
    KAFKA_*)
      key=${name#KAFKA_} && key=${key//___/-} && key=${key//__/:} && key=${key//_/.} && key=${key//:/_}
      printf '%s=%s\n' "${key,,}" "${!name}" >>"$config"
      ;;
  esac
done
if [ "${1:-}" = --properties ]; then
  cat "$config" && exit 0
fi
java=(java ${KAFKA_JVM_FLAGS:-} ${KAFKA_HEAP_OPTS:-} ${KAFKA_OPTS:-} "-Dlog4j2.configurationFile=/opt/kafka/log4j2.yaml"
  -cp "/opt/kafka/libs/*")
scram=()
for role in api batcher worker router admin; do
  if [ -r "/run/secrets/${role}.password" ]; then
    scram+=(--add-scram "SCRAM-SHA-512=[name=${role},password=$(cat "/run/secrets/${role}.password")]")
  fi
done
"${java[@]}" kafka.tools.StorageTool format --ignore-formatted -t "${CLUSTER_ID:?}" -c "$config" "${scram[@]}"
exec "${java[@]}" kafka.Kafka "$config"
