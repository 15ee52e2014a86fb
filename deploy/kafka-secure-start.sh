#!/bin/bash
# The apache/kafka image's start, preceded by formatting its storage with one SCRAM-SHA-512 credential per llmq role
# (passwords: the mounted secrets /run/secrets/<role>.password). The image's own format step then finds the storage
# formatted and starts the broker. Used by docker-compose.yml; credentials live only in the cluster metadata.
set -euo pipefail
roles=(api batcher worker router admin)
formatting=$(mktemp)
cat >"$formatting" <<PROPERTIES
process.roles=${KAFKA_PROCESS_ROLES}
node.id=${KAFKA_NODE_ID}
controller.quorum.voters=${KAFKA_CONTROLLER_QUORUM_VOTERS}
controller.listener.names=${KAFKA_CONTROLLER_LISTENER_NAMES}
listeners=${KAFKA_LISTENERS}
listener.security.protocol.map=${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP}
inter.broker.listener.name=${KAFKA_INTER_BROKER_LISTENER_NAME}
log.dirs=${KAFKA_LOG_DIRS:-/tmp/kraft-combined-logs}
PROPERTIES
scram=()
for role in "${roles[@]}"; do
  scram+=(--add-scram "SCRAM-SHA-512=[name=${role},password=$(cat "/run/secrets/${role}.password")]")
done
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" -c "$formatting" "${scram[@]}"
rm -f "$formatting"
exec /etc/kafka/docker/run
