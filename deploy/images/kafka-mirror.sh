#!/bin/bash
# MirrorMaker 2 (dedicated mode) in the llmq-kafka image: the connect-mirror jars of the broker's version that
# `llmq dev install` assembled, as `llmq dev mirror` runs them; arguments as connect-mirror-maker.sh takes them (the
# properties file, then --clusters <target region>). The Helm chart's mirrorMaker runs it.
set -euo pipefail
exec java ${KAFKA_JVM_FLAGS:-} ${KAFKA_HEAP_OPTS:-} ${KAFKA_OPTS:-} \
  -Dlog4j2.configurationFile=/opt/kafka/mirror-log4j2.properties -cp "/opt/kafka/mirror-libs/*" \
  org.apache.kafka.connect.mirror.MirrorMaker "$@"
